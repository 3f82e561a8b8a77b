"""Records without lease state (issue 16): in a lists crawl without politeness created
since, a lease writes no record (attempts and token are in the lease's entry and the
lease reply), and every way out of a lease keeps attempts counting and tokens
exactly-once. Crawls created before keep their record format (``FMT`` in lua/lib.lua,
:data:`redcrawl.frontier.records.LEASE_STATE_OUT`)."""

from __future__ import annotations

import hashlib

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.frontier import FrontierCore
from redcrawl.frontier.records import (
    LEASE_STATE_OUT,
    PUSH_STAMPED,
    layout_without_stamps,
    lease_state_out,
    parse_record,
)

from .conftest import Clock, FrontierFactory

pytestmark = pytest.mark.backends("lists")


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


def urls(n: int, prefix: str = "http://example.com/p") -> list[Envelope]:
    return [env(f"{prefix}{i}") for i in range(n)]


def check(f: FrontierCore) -> None:
    c = f.counts()
    assert c.conserved, c


def make(make_frontier: FrontierFactory, **settings: object) -> FrontierCore:
    return make_frontier(politeness=False, **settings)


def test_new_crawl_is_marked_and_a_lease_writes_no_record(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make(make_frontier)
    f.push(urls(3))
    layout = redis_client.hget(f.keys.control, "layout")
    assert isinstance(layout, bytes) and layout.endswith(LEASE_STATE_OUT + PUSH_STAMPED)
    before = redis_client.hgetall(f.keys.req)
    got = f.lease("w", 3)
    assert [x.attempts for x in got] == [1, 1, 1]
    assert redis_client.hgetall(f.keys.req) == before  # nothing rewritten
    (info, *_) = f.inflight()
    assert info.attempts == 1 and info.worker == "w"
    described = f.describe(info.id)
    assert described is not None and described.state == "in_flight"
    assert (described.attempts, described.worker) == (1, "w")
    assert f.ack(got) == 3
    check(f)


def test_attempts_count_through_expiry_nack_release_to_dead(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    f = make(make_frontier, max_attempts=3, lease_ttl=1)
    f.push(urls(1))
    (a,) = f.lease("w1", 1)
    assert a.attempts == 1
    assert f.release([a]) == 1  # given back: no attempt spent
    (b,) = f.lease("w1", 1)
    assert b.attempts == 1
    clock.advance(2)  # expires: one attempt spent
    (c,) = f.lease("w2", 1)
    assert c.attempts == 2
    assert f.nack(c, "boom", delay=0) == "retried"
    (d,) = f.lease("w2", 1)
    assert d.attempts == 3
    described = f.describe(f.inflight()[0].id)
    assert described is not None and described.attempts == 3
    clock.advance(2)
    f.maintain()
    (dead,) = f.dead()
    assert "lease expired 3 times" in dead.error and dead.attempts == 3
    assert f.requeue_dead() == 1
    (e,) = f.lease("w3", 1)
    assert e.attempts == 1
    # every earlier token is stale
    assert f.ack([a, b, c, d]) == 0
    assert f.nack(d, "late") == "stale"
    assert f.ack([e]) == 1
    check(f)


def test_stale_tokens_refused_while_the_old_lease_lives(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """The old lease still holds another request (its entry still lists the first one):
    its token must not ack a request that left it and came back."""
    f = make(make_frontier)
    f.push(urls(2))
    a, b = f.lease("w1", 2)
    assert f.nack(a, "retry", delay=0) == "retried"
    (a2,) = f.lease("w2", 1)
    assert a2.id == a.id
    assert f.ack([a]) == 0  # a's old token: the lease lives on (b), a left it
    assert f.release([a]) == 0
    assert f.nack(a, "x") == "stale"
    assert f.counts().in_flight == 2
    assert f.ack([a2, b]) == 2
    # acked under a live lease, then pushed again (recrawl): the old token stays stale
    f.push(urls(2, "http://other/"))
    c, d = f.lease("w3", 2)
    assert f.ack([c]) == 1
    assert f.push([env(c.envelope.url)], recrawl=True).accepted == 1
    assert f.ack([c]) == 0
    assert f.counts().ready == 1
    (c2,) = f.lease("w4", 1)
    assert c2.attempts == 1
    assert f.ack([c2, d]) == 2
    check(f)


def test_a_token_acks_only_what_its_lease_lists(make_frontier: FrontierFactory) -> None:
    f = make(make_frontier)
    f.push(urls(2))
    (a,) = f.lease("w1", 1)
    (b,) = f.lease("w2", 1)
    forged = type(a)(a.id, b.token, a.worker, a.attempts, a.envelope, a.received)
    assert f.ack([forged]) == 0
    assert f.counts().in_flight == 2
    assert f.ack([a, b]) == 2
    check(f)


def test_crawl_created_before_keeps_its_record_format(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make(make_frontier)
    f.push(urls(1))
    layout = redis_client.hget(f.keys.control, "layout")
    assert isinstance(layout, bytes)
    before = layout.replace(LEASE_STATE_OUT, b"")  # as the code before this format made it
    g = make(make_frontier, crawl="old")
    redis_client.hset(g.keys.control, mapping={"layout": before, "layout.copy": before})
    g.push(urls(2))
    a, b = g.lease("w", 2)
    rec = redis_client.hget(g.keys.req, a.id)
    assert isinstance(rec, bytes)
    assert parse_record(rec)[1:3] == (1, a.token)  # the lease state in the record
    assert redis_client.hget(g.keys.control, "layout") == before  # kept
    assert g.ack([a]) == 1
    assert g.nack(b, "x", delay=0) == "retried"
    (b2,) = g.lease("w", 1)
    assert b2.attempts == 2 and g.ack([b]) == 0 and g.ack([b2]) == 1
    check(g)


def created(f: FrontierCore, redis_client: redis.Redis) -> bytes:
    """The stored layout of ``f``'s crawl, created by a push."""
    f.push(urls(1))
    layout = redis_client.hget(f.keys.control, "layout")
    assert isinstance(layout, bytes)
    return layout


def test_polite_lists_crawls_leave_the_records_alone_streams_crawls_do_not(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier(politeness=True)
    assert created(f, redis_client).endswith(LEASE_STATE_OUT + PUSH_STAMPED)
    (a,) = f.lease("w", 1)
    rec = redis_client.hget(f.keys.req, a.id)
    assert isinstance(rec, bytes) and rec.split(b"|", 3)[1:3] == [b"0", b""]
    s = make_frontier("s", backend="streams", politeness=False)
    assert LEASE_STATE_OUT not in created(s, redis_client)


def accepted_before_session_24(created: str, layout: str) -> bool:
    """Whether a worker of redcrawl before session 24 (245a70d) accepts a crawl whose stored
    layout is ``created`` (its own settings' layout: ``layout``): lib.lua's check then,
    with the lease state out of the records whenever " +leasestate" is there. Such a
    worker keeps polite crawls' lease state in their records, so it must refuse a polite
    lists crawl created since (a review found it accepted one and leaked its site's slot
    for good)."""
    if created in (layout + " +leasestate +pushtime", layout + " +pushtime"):
        return True
    rest = created.removesuffix(" +pushtime").removesuffix(" +leasestate")
    return rest == layout


def test_a_polite_lists_crawl_is_refused_by_workers_before_its_record_format(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    polite = created(make_frontier(politeness=True), redis_client)
    assert lease_state_out(polite)
    without = created(make(make_frontier, crawl="plain"), redis_client)
    base = layout_without_stamps(polite).decode()
    assert not accepted_before_session_24(polite.decode(), base)
    # a crawl without politeness is the same format as before: older workers share it
    assert accepted_before_session_24(without.decode(), layout_without_stamps(without).decode())
    # and this worker opens both (its lease state out of the records)
    again = make_frontier(politeness=True)
    assert again._lease_state_out() and len(again.lease("w", 1)) == 1


def test_a_fingerprint_the_done_filter_forgot_is_not_held_by_its_old_lease(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    window = 3600.0
    f = make(make_frontier, recrawl_after=window, lease_ttl=3 * window, dedupe_capacity=10_000)
    f.push(urls(2))
    a, b = f.lease("w1", 2)
    assert f.ack([a]) == 1
    clock.advance(window * 1.3)  # past W * (1 + 1/4): a's fingerprint forgotten
    assert f.push([env(a.envelope.url)]).accepted == 1
    assert f.ack([a]) == 0  # its old lease lives on (b), but no longer holds it
    assert f.counts().ready == 1
    assert f.ack([b]) == 1
    (a2,) = f.lease("w2", 1)
    assert a2.attempts == 1 and f.ack([a2]) == 1
    check(f)


def test_without_recrawl_a_push_writes_no_fence(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make(make_frontier)
    f.push(urls(1))
    f.ack(f.lease("w", 1))
    f.push(urls(1, "http://b/"))
    (rec,) = redis_client.hvals(f.keys.req)
    assert (
        isinstance(rec, bytes) and parse_record(rec)[2] == ""
    )  # (memory: no lease counter digits per record)
