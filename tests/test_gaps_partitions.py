"""DONE fingerprints on a partitioned crawl (``REDCRAWL_PARTITIONS`` > 1): a fingerprint
marked done by its fingerprint alone (``redcrawl import-dupefilter``, the import of a
scrapy-redis dupefilter) filters its request in whichever partition the request's site
lands in, and the standalone DupeFilter asks one partition per request, not all P."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
import redis
import scrapy
from typer.testing import CliRunner

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import PartitionedFrontier, open_frontier
from redcrawl.scrapy.dupefilter import DupeFilter
from redcrawl.settings import Settings

from .conftest import RedisServer
from .partition_helpers import hosts_in
from .test_partitions import P


def fp(url: str) -> bytes:
    return hashlib.sha1(url.encode()).digest()


def urls_per_partition() -> list[str]:
    """One URL on a host of each partition."""
    return [f"http://{hosts_in(p, P, 1)[0]}/page" for p in range(P)]


@pytest.fixture
def frontier(redis7_client: redis.Redis) -> Iterator[PartitionedFrontier]:
    f = open_frontier(redis7_client, Settings(partitions=P), "c")
    assert isinstance(f, PartitionedFrontier)
    yield f


def test_a_fingerprint_marked_done_is_a_duplicate_in_every_partition(
    frontier: PartitionedFrontier,
) -> None:
    """The bug: ``done.add`` wrote partition 0's filter, while a push checks the filter of
    the request's own partition: a URL marked done on a site of partition 1, 2 or 3 was
    accepted (and fetched again)."""
    urls = urls_per_partition()
    assert sorted(frontier.partition(Envelope(url=u)) for u in urls) == list(range(P))
    assert frontier.done.add([fp(u) for u in urls]) == [True] * P
    assert frontier.done.add([fp(u) for u in urls]) == [False] * P  # there already
    result = frontier.push([Envelope(url=u, fingerprint=fp(u)) for u in urls])
    assert (result.accepted, result.filtered) == (0, P)
    assert frontier.done.contains([fp(u) for u in urls]) == [True] * P


def test_a_fingerprint_done_in_its_partition_is_not_new_to_done_add(
    frontier: PartitionedFrontier,
) -> None:
    """A request crawled to DONE in its partition: adding its fingerprint again says it
    was there (an import counts it as already known)."""
    url = urls_per_partition()[2]
    frontier.push([Envelope(url=url, fingerprint=fp(url))])
    assert frontier.ack(frontier.lease("w", 1)) == 1
    assert frontier.done.add([fp(url), fp("http://new.example/")]) == [False, True]


def test_import_dupefilter_filters_requests_of_every_partition(
    redis7: RedisServer, redis7_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``redcrawl import-dupefilter`` into a partitioned crawl, then the requests whose
    fingerprints it imported are pushed: every one is a duplicate."""
    from redcrawl.cli import app

    urls = urls_per_partition()
    redis7_client.sadd("sr:dupefilter", *[fp(u).hex() for u in urls])
    monkeypatch.setenv("REDCRAWL_PARTITIONS", str(P))
    args = ["import-dupefilter", "sr:dupefilter", "--redis-url", redis7.url, "--crawl", "c"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"{P} added" in result.output
    f = open_frontier(redis7_client, Settings(partitions=P), "c")
    pushed = f.push([Envelope(url=u, fingerprint=fp(u)) for u in urls])
    assert (pushed.accepted, pushed.filtered) == (0, P)


def _evals(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_the_standalone_dupefilter_asks_one_partition_per_request(
    redis7: RedisServer, redis7_client: redis.Redis, frontier: PartitionedFrontier
) -> None:
    """Same answers as asking every partition, in two script calls per request (the
    request's partition's DONE filter, then the seen filter) instead of P + 1."""
    urls = urls_per_partition()
    done, imported = urls[1], urls[3]
    frontier.push([Envelope(url=done, fingerprint=fingerprint(done))])
    assert frontier.ack(frontier.lease("w", 1)) == 1
    frontier.done.add([fingerprint(imported)])
    slot = "http://x.example/slotted"  # its partition is its download slot's
    frontier.push([Envelope(url=slot, fingerprint=fingerprint(slot), meta={"download_slot": "s1"})])
    assert frontier.ack(frontier.lease("w", 1)) == 1
    df = DupeFilter(Settings(redis_url=redis7.url, crawl="c", partitions=P))
    try:
        df.request_seen(scrapy.Request("http://warm.example/"))  # connects, loads scripts
        redis7_client.config_resetstat()
        assert df.request_seen(scrapy.Request(done))
        assert df.request_seen(scrapy.Request(imported))
        assert df.request_seen(scrapy.Request(slot, meta={"download_slot": "s1"}))
        assert _evals(redis7_client) == 3  # one each: found done
        redis7_client.config_resetstat()
        assert not df.request_seen(scrapy.Request(urls[0]))
        assert df.request_seen(scrapy.Request(urls[0]))  # seen through the filter
        assert _evals(redis7_client) == 4  # done (no), seen; done (no), seen
    finally:
        df.close("finished")
