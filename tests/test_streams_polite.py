"""What only a streams crawl with fleet-wide politeness has: ready requests wait in the
per-key queues (lua/polite.lua), a stream holds only granted entries (pending at once),
expired entries go back to their key's queue, and a streams crawl created without
politeness keeps its layout. The politeness behaviour itself (limits, slots, delays,
blocks, charges) is tested on both backends: tests/test_politeness_*.py."""

from __future__ import annotations

import hashlib
import logging

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.errors import FrontierError, LayoutMismatch
from redcrawl.frontier import StreamsFrontier, open_frontier
from redcrawl.frontier.streams import GROUP
from redcrawl.settings import Settings

from .conftest import Clock, FrontierFactory

pytestmark = pytest.mark.backends("streams")


def env(url: str, priority: int = 0) -> Envelope:
    return Envelope(url=url, priority=priority, fingerprint=hashlib.sha1(url.encode()).digest())


def site(host: str, n: int) -> list[Envelope]:
    return [env(f"http://{host}/p{i}") for i in range(n)]


def polite(make_frontier: FrontierFactory, **settings: object) -> StreamsFrontier:
    params: dict[str, object] = {
        "politeness_concurrency": 2,
        "politeness_delay": 0.0,
        "politeness_randomize": False,
    }
    f = make_frontier(**{**params, **settings})
    assert isinstance(f, StreamsFrontier) and f.politeness == "host"
    return f


def entries(client: redis.Redis, f: StreamsFrontier) -> tuple[int, int]:
    """(entries in the streams, of which pending)."""
    length = pending = 0
    for key in f.stream_keys():
        length += client.xlen(key)
        if client.exists(key) and client.xinfo_groups(key):
            pending += int(client.xpending(key, GROUP)["pending"])
    return length, pending


def test_a_stream_holds_only_granted_entries(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 5) + site("b.test", 5))
    assert entries(redis_client, f) == (0, 0)  # READY is the per-key queues
    c = f.counts()
    assert (c.ready, c.in_flight) == (10, 0) and c.conserved
    got = f.lease("w1", 10)
    assert len(got) == 4  # two of each site
    assert entries(redis_client, f) == (4, 4)  # each granted entry pending at once
    c = f.counts()
    assert (c.ready, c.in_flight) == (6, 4) and c.conserved
    f.ack(got)
    assert entries(redis_client, f) == (0, 0)
    rest = f.lease("w2", 10)
    assert len(rest) == 4 and f.counts().conserved
    # a site's requests share a stream (its shard: a hash of the politeness key)
    assert len({x.token.split("/")[1] for x in rest if "a.test" in x.envelope.url}) == 1


def test_an_expired_entry_goes_back_to_its_key_queue_with_its_slot(
    make_frontier: FrontierFactory, redis_client: redis.Redis, clock: Clock
) -> None:
    f = polite(make_frontier, politeness_concurrency=1, lease_ttl=5.0)
    f.push(site("a.test", 3))
    (first,) = f.lease("w1", 10)
    clock.advance(6.0)
    # the next lease reclaims it (w1's heartbeat is gone): back to the front of its
    # key's queue, its slot back, and granted again by the schedule
    (again,) = f.lease("w2", 10)
    assert again.id == first.id and again.attempts == 2
    assert int(f.client.hget(f.keys.pol_state_base + "a.test", "in")) == 1
    assert entries(redis_client, f) == (1, 1)
    c = f.counts()
    assert (c.ready, c.in_flight, c.reclaimed) == (2, 1, 1) and c.conserved


def test_deferral_and_response_time_on_streams(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 4))
    a, b = f.lease("w1", 10)
    assert f.free([(a, "s")]) == 1
    assert f.defer(b, "503", retry_after=30.0) == "deferred"
    assert f.lease("w2", 10) == []  # blocked for the fleet
    assert f.politeness_stats()["blocked"] == 1
    c = f.counts()
    assert (c.ready, c.in_flight) == (3, 1) and c.conserved


def test_a_streams_crawl_created_without_politeness_keeps_its_layout(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    old = open_frontier(redis_client, Settings(backend="streams", politeness=False), "old")
    old.push(site("a.test", 3))
    with caplog.at_level(logging.WARNING):
        f = open_frontier(redis_client, Settings(backend="streams"), "old")
    assert f.politeness is None
    assert "created without fleet-wide politeness" in caplog.text
    assert len(f.lease("w", 10)) == 3  # no per-key limit: served as before
    # a worker without politeness on a crawl with it is refused, naming the setting
    open_frontier(redis_client, Settings(backend="streams"), "new").push(site("a.test", 1))
    with pytest.raises(FrontierError, match="REDCRAWL_POLITENESS"):
        open_frontier(redis_client, Settings(backend="streams", politeness=False), "new").lease(
            "w", 1
        )
    # the API and the CLI open either layout
    again = open_frontier(redis_client, Settings(politeness=False), "new", follow_layout=True)
    assert isinstance(again, StreamsFrontier) and again.politeness == "host"


def test_a_lists_crawl_opened_as_streams_is_refused_without_a_false_warning(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # a polite lists crawl opened by a worker set to the streams backend: the layout
    # refusal names the backend; no warning that the crawl lacks politeness (it has it)
    open_frontier(redis_client, Settings(), "lst").push(site("a.test", 2))
    with caplog.at_level(logging.WARNING), pytest.raises(LayoutMismatch, match="lists"):
        open_frontier(redis_client, Settings(backend="streams"), "lst").lease("w", 1)
    assert "without fleet-wide politeness" not in caplog.text
    # and the other way round
    open_frontier(redis_client, Settings(backend="streams"), "str").push(site("a.test", 2))
    with caplog.at_level(logging.WARNING), pytest.raises(LayoutMismatch, match="streams"):
        open_frontier(redis_client, Settings(), "str").lease("w", 1)
    assert "without fleet-wide politeness" not in caplog.text
    # a polite streams crawl of 8 shards opened by a worker set to 4 (a review found this
    # one still warned, and the refusal then named the worker's layout without politeness)
    open_frontier(redis_client, Settings(backend="streams", shards=8), "s8").push(site("a.test", 2))
    with caplog.at_level(logging.WARNING), pytest.raises(LayoutMismatch) as refused:
        open_frontier(redis_client, Settings(backend="streams", shards=4), "s8").lease("w", 1)
    assert "without fleet-wide politeness" not in caplog.text
    assert "streams/4/host" in str(refused.value), refused.value


def test_purge_deletes_the_per_key_queues(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 5))
    f.lease("w", 1)
    f.purge()
    assert redis_client.keys(f"rc:{{{f.crawl}}}:*") == [f.keys.stats.encode()]
