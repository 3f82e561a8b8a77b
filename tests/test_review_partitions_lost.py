"""Review of 38e0a38 (a partitioned crawl's lost partitions) and 7b253a7 (the CLI's
``_guard``): sequences that report a healthy crawl "damaged: partitions ... lost" (which
stops the fleet: a worker raises PartitionsLost instead of finishing), and a Redis error
that still ends in a traceback. Each test drives the real frontier (or the real
``_guard``) against a real redis-server; the interleavings are made with the frontier's
own methods, hooked on the instance."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
import typer

from redcrawl.cli._common import _guard
from redcrawl.errors import CrawlVanished
from redcrawl.frontier import PartitionedFrontier
from redcrawl.frontier.durability import IDENTITY_FIELD
from redcrawl.frontier.partitioned import CLAIMED_FIELD, CREATED_FIELD

from .partition_helpers import envs, hosts_in, open_partitioned

P = 4


def fill(f: PartitionedFrontier, per: int = 2, tag: str = "") -> None:
    """``per`` new requests on one host of each partition."""
    hosts = [hosts_in(p, f.n, 1)[0] for p in range(f.n)]
    assert f.push(envs(hosts, per, tag)).accepted == per * f.n


def older_crawl(client: redis.Redis) -> PartitionedFrontier:
    """A partitioned crawl as an older redcrawl (3ca7b88..38e0a38) left it: the anchor
    holds its layout and no identity (nor ``parts.claimed``); an older worker's
    CrawlIdentity stored its own identity in the one partition it leased from (0); the
    other partitions, never leased from, hold none."""
    f = open_partitioned(client, P)
    fill(f)
    client.hdel(f.keys.control, IDENTITY_FIELD, CREATED_FIELD, CLAIMED_FIELD)
    for sub in f.parts:
        client.hdel(sub.keys.control, IDENTITY_FIELD, CREATED_FIELD)
    client.hset(f.parts[0].keys.control, IDENTITY_FIELD, "an-older-workers-own")
    return f


def test_an_older_crawl_whose_first_claim_was_cut_short_is_not_reported_lost(
    redis7_client: redis.Redis,
) -> None:
    """The first new-version process to write to an older crawl runs ``_claim``: its
    anchor round stores the crawl's identity in the anchor, then the process dies or its
    next round fails. Seen in review: the next claim no longer took the crawl for an older
    one (it judged by whether its own round stored the anchor's identity), found one
    partition holding an identity that was not the anchor's (an older worker's own), took
    the ANCHOR for lost and the three healthy partitions were reported lost."""
    older_crawl(redis7_client)
    anchor = open_partitioned(redis7_client, P).keys.control
    # what the cut-short claim's first round stored (its HSETNX of the layout was a no-op)
    redis7_client.hsetnx(anchor, CREATED_FIELD, "the-cut-short-claims-token")
    g = open_partitioned(redis7_client, P)
    fill(g, 1, "next")
    assert g.lost_partitions() == []


def test_two_new_workers_starting_on_an_older_crawl_at_once(
    redis7_client: redis.Redis,
) -> None:
    """The same with no failure at all: a fleet of upgraded workers starts on an older
    crawl. A's anchor round stores the anchor's identity; B's anchor round comes before A
    wrote ``parts.claimed`` (A reads the partitions and runs a maintain script per
    partition in between). Seen in review: B took the not-older path and adopted the
    older worker's identity: three partitions reported lost."""
    older_crawl(redis7_client)
    a = open_partitioned(redis7_client, P)
    b = open_partitioned(redis7_client, P)
    b_anchored, a_done = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    b_token = b._crawl_token

    def b_hooked(anchor_id: bytes) -> Any:
        b_anchored.set()  # (B's anchor round ran)
        assert a_done.wait(30)
        return b_token(anchor_id)

    a_token = a._crawl_token

    def a_hooked(anchor_id: bytes) -> Any:
        out = a_token(anchor_id)
        thread.start()
        assert b_anchored.wait(30)
        return out

    def run_b() -> None:
        try:
            fill(b, 1, "b")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_b)
    setattr(b, "_crawl_token", b_hooked)  # noqa: B010 (an instance's method, hooked)
    setattr(a, "_crawl_token", a_hooked)  # noqa: B010
    fill(a, 1, "a")
    a_done.set()
    thread.join(30)
    assert not errors and not thread.is_alive()
    fresh = open_partitioned(redis7_client, P)
    assert fresh.lost_partitions() == []


def test_a_crawl_created_while_another_process_purges_it(
    redis7_client: redis.Redis,
) -> None:
    """``redcrawl purge`` (or SCHEDULER_FLUSH_ON_START's) runs partition by partition
    (seconds for a large crawl); a process that opens the crawl meanwhile (``redcrawl
    seed``, the API's first POST of that crawl, a worker) claims it: the anchor still holds
    its layout and identity, ``parts.claimed`` was deleted first, so the claim is
    "completed" and gives the old identity to the partitions purged already. The purge
    then deletes the other partitions and the anchor. The next claim (the crawl created
    anew) finds a partition holding an identity and a new anchor: "the anchor lost its
    state" (a false warning), and every other partition is reported lost."""
    f = open_partitioned(redis7_client, P)
    fill(f)
    purger = open_partitioned(redis7_client, P)
    first = purger.parts[0].purge

    def purge_then_seed() -> None:
        first()
        fill(open_partitioned(redis7_client, P), 1, "seeded-during-the-purge")

    setattr(purger.parts[0], "purge", purge_then_seed)  # noqa: B010
    purger.purge()
    again = open_partitioned(redis7_client, P)
    fill(again, 1, "anew")
    assert again.lost_partitions() == []


def test_a_redis_error_outside_redis_errors_is_no_traceback(
    redis7_client: redis.Redis,
) -> None:
    """7b253a7: "a Redis error outside redis_errors is an error line, never a
    traceback". ``_guard`` re-raises it inside ``redis_errors`` and catches only the
    RedcrawlError that makes; ``redis_errors`` maps connection, cluster-down and
    response errors only, so any other RedisError (DataError, InvalidResponse,
    ClusterError "TTL exhausted", WatchError...) leaves the inner ``try`` as it came and
    the "Redis failed: ..." line after it is never reached: a traceback. Here redis-py's
    DataError of a real call (an HSET given nothing to set)."""

    @_guard
    def command(redis_url: str | None = None) -> None:
        redis7_client.hset("k", mapping={})  # (the bug: a call redis-py refuses)

    with pytest.raises(typer.Exit):
        command(redis_url=None)


def test_an_error_about_the_to_url_is_not_said_of_redis_url(
    redis7: Any, redis7_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """7b253a7 rewrites every message of a command given ``--redis-url`` that names
    "REDCRAWL_REDIS_URL / REDIS_URL" to name ``--redis-url``; ``redcrawl migrate``'s
    errors about its ``--to`` URL say those words too (``_target`` keeps connect()'s
    text), so a ``--to`` database out of range tells the user to fix ``--redis-url``."""
    from typer.testing import CliRunner

    from redcrawl.cli import app

    monkeypatch.delenv("REDCRAWL_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    fill(open_partitioned(redis7_client, P))
    target = redis7.url.rsplit("/", 1)[0] + "/99"  # (the server has databases 0..15)
    out = CliRunner().invoke(
        app,
        ["migrate", "--redis-url", redis7.url, "--to", target, "--crawl", "c"],
        env={"REDCRAWL_PARTITIONS": str(P)},
    )
    assert out.exit_code != 0 and "database 99" in out.output, out.output
    assert "--redis-url" not in out.output, out.output
    assert "REDCRAWL_REDIS_URL" not in out.output and "in --to (redis://" in out.output


def test_a_crawl_seeded_again_after_redis_lost_everything(
    redis7_client: redis.Redis,
) -> None:
    """The whole Redis came back empty (a restart without persistence, a failover to an
    empty replica) under a running worker: as designed, the worker goes on, stores what
    it settles, and raises CrawlVanished at the end, whose message says to seed the crawl
    again. But the worker's CrawlIdentity stores a random ``crawl.id`` in each partition
    it works in for the first time after the loss (here 1): the same field the claim
    gives every partition. Seeding the crawl again then claims it: no anchor, one
    partition holding an identity, so "the anchor lost its state": that stray identity is
    adopted and every other partition of the new crawl is reported lost."""
    f = open_partitioned(redis7_client, P)
    (h0,), (h1,) = hosts_in(0, P, 1), hosts_in(1, P, 1)
    assert f.push(envs([h0], 1)).accepted == 1
    worker = open_partitioned(redis7_client, P)
    worker.check_vanished = True
    (lease,) = worker.lease("w", 5)  # (its first work: partition 0's identity remembered)
    redis7_client.flushall()  # the Redis comes back empty
    worker.settle(push=envs([h1], 1, "child"), ack=[lease])  # its response's link
    (child,) = worker.lease("w", 5)  # (partition 1: the worker stores an identity there)
    assert worker.ack([child]) == 1
    with pytest.raises(CrawlVanished):  # as designed: the worker stops, "seed it again"
        worker.counts()
    seed = open_partitioned(redis7_client, P)  # `redcrawl seed`: the crawl anew
    fill(seed, 1, "anew")
    assert seed.lost_partitions() == []
