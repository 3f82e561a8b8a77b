"""A crawl split into partitions (``REDCRAWL_PARTITIONS``, frontier/partitioned.py) on one
Redis server with P = 4: the layout (a tag per partition, a request in its site's
partition, P fixed at creation), the conservation law summed over partitions (the state
machine of tests/test_frontier_properties.py), fair leasing across partitions, "finished"
only when every partition is empty, and 4 worker processes of which one is SIGKILLed.

The same on a real cluster with P = 16: tests/test_partitions_cluster.py. This module is
also the worker process of the SIGKILL tests: ``python -m tests.test_partitions URL CRAWL
WORKER LOGFILE BACKEND PARTITIONS`` (the log format of tests/frontier_worker.py).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.errors import CrawlVanished, LayoutMismatch
from redcrawl.frontier import FrontierCore, ListsFrontier, PartitionedFrontier, open_frontier
from redcrawl.keys import CrawlKeys, partition_of
from redcrawl.settings import Settings

from .conftest import Clock, RedisServer
from .killkit import kill_while_holding, parse_log, work_seconds
from .partition_helpers import envs, hosts_in, open_partitioned, run_machine
from .shop_helpers import crawl_the_shop

ROOT = Path(__file__).resolve().parent.parent
P = 4


def open_p(client: redis.Redis, crawl: str = "c", **settings: Any) -> PartitionedFrontier:
    return open_partitioned(client, P, crawl, **settings)


@pytest.fixture
def client(redis7_client: redis.Redis) -> redis.Redis:
    return redis7_client


# --- layout ------------------------------------------------------------------------------
def test_each_partition_has_its_tag_and_a_request_goes_to_its_sites_partition(
    client: redis.Redis,
) -> None:
    assert CrawlKeys("c").req == "rc:{c}:req"
    assert CrawlKeys("c", partition=3).req == "rc:{c/3}:req"
    f = open_p(client)
    hosts = [h for p in range(P) for h in hosts_in(p, P, 2)]
    assert f.push(envs(hosts, 3)).accepted == 24
    for p in range(P):
        ids = client.hkeys(f.parts[p].keys.req)
        assert len(ids) == 6  # two hosts of 3 requests each
    assert not client.exists("rc:{c}:req")  # the anchor holds no request
    leases: list[Any] = []
    while got := f.lease("w", 24):  # (a call asks one partition per 64 requests)
        leases += got
    assert len(leases) == 24
    assert {x.token.split(":")[0] for x in leases} == {"0", "1", "2", "3"}
    for lease in leases:
        host = lease.envelope.url.split("/")[2]
        assert lease.token.startswith(f"{partition_of(host, P)}:")
    assert f.ack(leases) == 24
    assert f.counts().done == 24 and f.counts().finished


def test_the_partition_of_a_site_never_changes() -> None:
    """Part of every partitioned crawl's stored layout: a change would put a site's new
    requests in another partition than its stored ones (dedupe and politeness split)."""
    sites = ["example.com", "xn--bcher-kva.de", "::1", "data:"]
    assert [partition_of(h, 16) for h in sites] == [6, 12, 4, 2]
    assert partition_of("example.com", 1) == 0


def test_the_partition_count_is_fixed_when_the_crawl_is_created(client: redis.Redis) -> None:
    f = open_p(client)
    f.push(envs(["a.example"], 2))
    for other in (1, 8):
        with pytest.raises(LayoutMismatch, match=r"created with 4 partitions.*PARTITIONS="):
            open_frontier(client, Settings(partitions=other), "c")
    # a one-partition frontier built directly is refused by its scripts
    with pytest.raises(LayoutMismatch):
        ListsFrontier(client, Settings(), "c").push(envs(["b.example"], 1))
    # tools follow the crawl's layout
    assert isinstance(
        open_frontier(client, Settings(), "c", follow_layout=True), PartitionedFrontier
    )
    # a crawl of one partition refuses a partitioned worker
    open_frontier(client, Settings(), "one").push(envs(["a.example"], 1))
    with pytest.raises(LayoutMismatch, match="created with 1 partition "):
        open_p(client, "one")
    # ... until purged: then it may be created again with another P
    f.purge()
    g = open_frontier(client, Settings(partitions=2), "c")
    assert g.push(envs(["a.example"], 2)).accepted == 2


def test_every_public_operation_of_the_interface_is_partitioned() -> None:
    """A method added to FrontierCore must get a partitioned version (inherited, it would
    run on the anchor's keys, or fail on attributes the anchor does not have)."""
    mine = {
        name
        for klass in PartitionedFrontier.__mro__
        if klass is not FrontierCore and issubclass(klass, PartitionedFrontier)
        for name in vars(klass)
    }
    public = {
        name
        for name, value in inspect.getmembers(FrontierCore)
        if not name.startswith("_") and callable(value)
    }
    assert public - mine == set()


# --- the conservation law ------------------------------------------------------------------
@pytest.mark.parametrize(
    "backend,ordering", [("lists", "fifo"), ("lists", "priority"), ("streams", "fifo")]
)
def test_random_interleavings_with_four_partitions(
    redis7: RedisServer, backend: str, ordering: str
) -> None:
    """tests/test_frontier_properties.py's machine (conservation law, counters against a
    model, one owner per request, politeness caps) on a crawl of 4 partitions: its three
    hosts fall in different partitions."""
    assert len({partition_of(f"s{h}", P) for h in range(3)}) >= 2
    client = redis.Redis.from_url(redis7.url)
    try:
        run_machine(
            "PartitionedMachine",
            client,
            examples=40,
            steps=40,
            backend=backend,
            ordering=ordering,
            partitions=P,
        )
    finally:
        client.close()


# --- leasing across partitions ------------------------------------------------------------
def check_fair_leasing(f: PartitionedFrontier, big: int, small: int) -> None:
    """Partition 0 gets 10x the work of partition 1: leases follow the ready work (the
    small partition is served all along, not after the big one), and neither starves."""
    assert f.push(envs(hosts_in(0, f.n, 10), big // 10, "b")).accepted == big
    assert f.push(envs(hosts_in(1, f.n, 2), small // 2, "s")).accepted == small
    order: list[int] = []
    while True:
        got = f.lease("w", 10)
        if not got:
            break
        order += [int(x.token.split(":")[0]) for x in got]
        assert f.ack(got) == len(got)
    assert Counter(order) == {0: big, 1: small}
    half = order[: (big + small) // 2]
    share = half.count(1) / len(half)
    assert 0.5 * small / (big + small) <= share <= 2.0 * small / (big + small) + 0.05, share
    # served all along: in every quarter of the crawl
    quarter = len(order) // 4
    assert all(1 in order[q * quarter : (q + 1) * quarter] for q in range(4))
    assert f.counts().finished


def test_leases_follow_the_ready_work_of_each_partition(client: redis.Redis) -> None:
    check_fair_leasing(open_p(client, politeness=False), 400, 40)


def test_a_partition_with_little_work_is_not_starved(client: redis.Redis) -> None:
    f = open_p(client, politeness=False)
    f.push(envs(hosts_in(0, P, 10), 100, "b"))
    f.push(envs(hosts_in(2, P, 1), 1, "s"))
    seen: list[int] = []
    for _ in range(40):  # 1/(4P) of the weight at least: served within ~16 requests
        got = f.lease("w", 1)
        seen += [int(x.token.split(":")[0]) for x in got]
        f.ack(got)
        if 2 in seen:
            break
    assert 2 in seen, seen


def test_finished_only_when_every_partition_is_empty(client: redis.Redis) -> None:
    f = open_p(client, politeness=False)
    f.push(envs(hosts_in(1, P, 1), 1) + envs(hosts_in(3, P, 1), 1))
    leases = f.lease("w", 2) + f.lease("w", 2)
    assert len(leases) == 2 and leases[0].token[0] != leases[1].token[0]
    assert f.ack(leases[:1]) == 1
    assert not f.counts().finished
    assert f.nack(leases[1], "boom", delay=30) == "retried"  # delayed in its partition
    c = f.counts()
    assert (c.delayed, c.finished, c.conserved) == (1, False, True)


def test_a_lease_call_keeps_the_workers_leases_in_other_partitions_alive(
    client: redis.Redis, clock: Clock
) -> None:
    """As in a crawl of one partition, a worker that keeps leasing keeps what it holds:
    its heartbeat is renewed in every partition where it holds leases, not only where it
    leases now."""
    f = open_frontier(
        client, Settings(partitions=P, politeness=False, lease_ttl=10), "c", clock=clock
    )
    f.push(envs(hosts_in(1, P, 1), 1))
    held = f.lease("w", 1)
    assert len(held) == 1 and held[0].token.startswith("1:")
    f.push(envs(hosts_in(0, P, 1), 10))
    for _ in range(4):
        clock.advance(6)
        got = f.lease("w", 1)
        assert [x.token[:2] for x in got] == ["0:"]
        f.ack(got)
    f.maintain()
    assert f.counts().reclaimed == 0 and f.ack(held) == 1
    clock.advance(11)  # it holds nothing more there: no heartbeat needed, none kept


def test_next_open_is_the_first_site_to_open_in_any_partition(
    client: redis.Redis, clock: Clock
) -> None:
    settings = Settings(partitions=P, politeness_delay=10, politeness_randomize=False)
    f = open_frontier(client, settings, "c", clock=clock)
    assert isinstance(f, PartitionedFrontier)
    f.push(envs(hosts_in(1, P, 1), 2) + envs(hosts_in(3, P, 1), 2))
    got: list[Any] = []
    while more := f.lease("w", 10):
        got += more
    assert len(got) == 2  # one per site: the next waits for the delay
    first = f.next_open()
    subs = [t for t in (sub.next_open() for sub in f.parts) if t is not None]
    assert first is not None and len(subs) == 2 and first == pytest.approx(min(subs))
    assert 5 <= first <= 15
    clock.advance(4)
    assert f.next_open() == pytest.approx(first - 4)


def test_pause_purge_renew_and_inspection_cover_every_partition(client: redis.Redis) -> None:
    f = open_p(client, politeness=False)
    batch = envs([h for p in range(P) for h in hosts_in(p, P, 1)], 2)
    undeduped = [Envelope(url=f"http://{h}/x", dont_filter=True) for h in hosts_in(2, P, 1)]
    f.push(batch + undeduped * 2)
    f.pause()
    assert f.is_paused() and f.lease("w", 10) == []
    f.resume()
    leases = []
    while got := f.lease("w", 100):
        leases += got
    assert len(leases) == 10
    ids = [x.id for x in leases if len(x.id) != 20]
    assert len(ids) == len(set(ids)) == 2 and all(b"@2" in i for i in ids)  # unique ids
    f.renew("w", 60)
    assert set(f.workers()) == {"w"}
    assert len(f.inflight()) == 10
    one = leases[0]
    assert f.nack(one, "bad", retry=False) == "dead"
    dead = f.dead()
    assert [d.error for d in dead] == ["bad"]
    assert f.describe(dead[0].id) is not None and f.describe(dead[0].id).state == "dead"  # type: ignore[union-attr]
    assert f.requeue_dead([dead[0].id]) == 1
    assert f.release(leases[1:]) == 9
    assert len(f.pending()) == 10
    c = f.counts()
    assert (c.accepted, c.ready, c.requeued, c.conserved) == (10, 10, 1, True)
    f.purge()
    assert f.counts().accepted == 0
    assert not client.exists(f.keys.control)


# --- SIGKILL -------------------------------------------------------------------------------
def run_kill_test(url: str, frontier: PartitionedFrontier, n: int, workers: int, tmp: Path) -> None:
    """``workers`` processes lease and ack ``n`` requests of a partitioned crawl; one is
    SIGKILLed while it holds leases. Every request ends DONE, acked once; what the victim
    held is handed out again; the survivors count every request."""
    hosts = [f"site{i}.example" for i in range(64)]
    batch = [
        Envelope(url=f"http://{hosts[i % 64]}/{i}", fingerprint=hashlib.sha1(b"%d" % i).digest())
        for i in range(n)
    ]
    assert frontier.push(batch).accepted == n
    assert len({frontier.partition(e) for e in batch}) == frontier.n
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    logs = [tmp / f"w{i}.log" for i in range(workers)]

    def start(i: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.test_partitions",
                url,
                frontier.crawl,
                f"w{i}",
                str(logs[i]),
                frontier.BACKEND,
                str(frontier.n),
            ],
            cwd=ROOT,
            env=env,
        )

    # The victim starts first and has processed a batch before the others start: under a
    # loaded CI the others once finished the crawl before it held anything. (Its log says
    # so; polling for its leases once missed every one of them: it holds a batch for a
    # moment only, and a poll of every partition on a loaded cluster takes longer.)
    victim = start(1)
    procs = [victim]
    try:
        deadline = time.monotonic() + 90
        while not (logs[1].exists() and logs[1].read_text()):
            assert victim.poll() is None, f"w1 exited ({victim.returncode}) before leasing"
            assert time.monotonic() < deadline, "w1 never leased"
            time.sleep(0.02)
        procs = [victim if i == 1 else start(i) for i in range(workers)]
        while frontier.counts().done < n // 3:
            assert time.monotonic() < deadline, "workers made no progress"
            time.sleep(0.02)
        held = kill_while_holding(victim, "w1", frontier, deadline, logs[1])
        for p in procs:
            if p is not victim:
                assert p.wait(timeout=180) == 0
    finally:  # a failed test leaves no worker behind to fail a later one on this xdist worker
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    c = frontier.counts()
    assert (c.accepted, c.done, c.dead, c.pending) == (n, n, 0, 0), c
    assert c.conserved
    acked: dict[str, list[str]] = defaultdict(list)
    processed: set[str] = set()
    for i, log in enumerate(logs):
        batches, counts = parse_log(log)
        for k, done in enumerate(batches):
            processed |= {rid for rid, _ in done}
            if k < len(counts) and counts[k] == len(done):
                for rid, _ in done:
                    acked[rid].append(f"w{i}")
            elif f"w{i}" != "w1":
                assert k >= len(counts), f"a survivor w{i} lost a lease"
    assert len(processed) == n
    assert not {r: w for r, w in acked.items() if len(w) > 1}, "acked twice"
    assert set(acked) == processed, "processed but never acknowledged"
    assert held and all(x.id in acked for x in held)
    assert {x.id for x in held} <= {rid for rid, ws in acked.items() if "w1" not in ws}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_sigkill_one_of_four_workers_of_a_partitioned_crawl_loses_nothing(
    redis7: RedisServer, client: redis.Redis, tmp_path: Path, backend: str
) -> None:
    frontier = open_p(client, "kill", backend=backend)
    run_kill_test(redis7.url, frontier, 6000, 4, tmp_path)


# --- a Scrapy crawl ------------------------------------------------------------------------
@pytest.mark.slow
def test_two_scrapy_workers_crawl_the_shop_with_four_partitions(
    redis7: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    """``redcrawl crawl`` with 2 Scrapy workers and REDCRAWL_PARTITIONS=4: every page
    fetched once, the crawl finished in every partition, ``redcrawl status`` reads it.
    (The shop is one site, so its requests are in one partition; the others stay empty.)"""
    shop = crawl_the_shop(
        redis7.url, tmp_path, products=200, timeout=240, REDCRAWL_PARTITIONS=str(P)
    )
    f = open_p(client, "shop")
    c = f.counts()
    assert c.finished and c.conserved and c.done == len(shop.expected) and c.dead == 0, c
    assert sum(1 for sub in f.parts if sub.counts().accepted) == 1  # one site: one partition


def main(url: str, crawl: str, worker: str, logfile: str, backend: str, partitions: str) -> None:
    """A worker process: lease, "process", ack, until the crawl is done (see
    tests/frontier_worker.py, whose log format this keeps)."""
    from redcrawl.connection import connect

    settings = Settings(
        redis_url=url,
        lease_ttl=1.5,
        batch_size=50,
        backend=backend,  # type: ignore[arg-type]
        partitions=int(partitions),
    )
    frontier = open_frontier(connect(settings), settings, crawl)
    with open(logfile, "a", buffering=1) as log:
        idle_since = None
        while True:
            leases = frontier.lease(worker, 50)
            if not leases:
                if frontier.counts().finished:
                    if idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > 0.5:
                        break
                time.sleep(0.05)
                continue
            idle_since = None
            time.sleep(work_seconds(logfile))  # (a hunted victim is slow: tests/killkit.py)
            log.write("\n".join(f"P {x.id.hex()} {x.token}" for x in leases) + "\n")
            log.flush()
            log.write(f"A {frontier.ack(leases)} {len(leases)}\n")
            log.flush()


if __name__ == "__main__":
    main(*sys.argv[1:7])


# --- durability: REDCRAWL_WAIT_REPLICAS and a vanished partition ---------------------------
def drain(f: PartitionedFrontier) -> None:
    """Lease and ack until nothing is left (leases of one call may come from a few
    partitions only)."""
    for _ in range(100):
        got = f.settle(lease=("w", 8)).leases
        if not got and f.counts().pending == 0:
            return
        assert f.settle(ack=got).acked == len(got)
    raise AssertionError("the crawl did not drain")


def test_wait_replicas_covers_the_partitioned_settle(client: redis.Redis) -> None:
    """Each settle round waits for the replicas (one WAIT per node: here the one server,
    which has none, so every round is counted short and the crawl goes on)."""
    f = open_p(client, wait_replicas=1, wait_timeout=0.01)
    assert f.replica_wait is not None
    assert all(sub.replica_wait is f.replica_wait for sub in f.parts)
    hosts = [h for p in range(P) for h in hosts_in(p, P, 1)]
    assert f.settle(push=envs(hosts, 2)).pushed.accepted == 2 * P
    assert f.replica_wait.calls == 1 and f.replica_wait.short == 1  # one round, one node
    drain(f)
    assert f.counts().finished
    assert f.replica_wait.short == f.replica_wait.calls > 2  # every round waited for


def test_a_partition_that_vanished_under_a_worker_is_not_finished(client: redis.Redis) -> None:
    """A partition's master came back empty (its control hash gone): the worker's counts
    raise CrawlVanished instead of reporting the crawl finished."""
    f = open_p(client)
    f.check_vanished = True
    assert all(sub.check_vanished for sub in f.parts)
    hosts = [h for p in range(P) for h in hosts_in(p, P, 1)]
    f.settle(push=envs(hosts, 1))
    drain(f)
    assert f.counts().finished  # the identities are there
    client.delete(*[k for k in client.keys("rc:{c/2}:*")])
    with pytest.raises(CrawlVanished, match="c"):
        f.counts()


@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_ready_counts_every_partitions_queued_requests(client: redis.Redis, backend: str) -> None:
    """With politeness, ready requests wait in per-site queues (a streams crawl's too, not
    in its streams): the crawl's ready count and "finished" see them in every partition."""
    f = open_p(client, backend=backend)
    assert f.politeness is not None
    hosts = [h for p in range(P) for h in hosts_in(p, P, 2)]
    assert f.settle(push=envs(hosts, 3)).pushed.accepted == 6 * P
    c = f.counts()
    assert (c.ready, c.pending, c.finished) == (6 * P, 6 * P, False), c
    assert c.conserved
