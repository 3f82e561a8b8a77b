"""A first look at a Redis Cluster failover: the master holding a crawl is SIGKILLed while
a worker runs its lease/settle loop; its replica is promoted (``cluster-node-timeout``
2 s) and the worker carries on through the same ``redis+cluster://`` client, which
waits and retries as it does through an outage (:class:`redcrawl.cluster.ClusterClient`).

The crawl is a tree: request ``i`` has the children ``2i+1`` and ``2i+2`` (below N),
pushed in the settle that acknowledges ``i`` (children stored before the parent's ack, in
one script). Redis replicates asynchronously, so what the dead master did in its last
moments may be missing on the replica: a settle whose reply the worker got (children
stored, parent acked, new leases) may be undone. The worker then processes leases the
new master never handed out; those requests are still READY there and are processed
again. Counted here:

- **lost**: a request never processed although the crawl finished (a child whose push
  was acknowledged and then undone, with its parent's ack kept) -- must be 0;
- **repeated**: processings beyond the first, reported (and bounded by a few batches);
- **stalled**: the longest time between two settles that returned.

Run with ``-s`` to see the numbers. ``_run(..., lag=...)`` (not run in CI: the outcome
depends on a race) freezes the replica before the kill, to measure what replication lag
costs (see docs/cluster.md, "Durability"). The same under a Scrapy fleet, with and
without ``REDCRAWL_WAIT_REPLICAS``: tests/test_cluster_failover_scrapy.py; a crawl that
vanished whole: tests/test_cluster_failover_durability.py.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.frontier import FrontierCore, Lease, open_frontier
from redcrawl.redis_server import LocalCluster
from redcrawl.settings import Settings

from . import cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

N = 3000
BATCH = 20


def _env(i: int) -> Envelope:
    return Envelope(url=f"http://site/{i}", fingerprint=hashlib.sha1(b"%d" % i).digest())


def _children(lease: Lease) -> list[Envelope]:
    i = int(lease.envelope.url.rsplit("/", 1)[1])
    return [_env(c) for c in (2 * i + 1, 2 * i + 2) if c < N]


def tree_worker(
    frontier: FrontierCore,
    pipelined: bool,
    processed: Counter[int],
    errors: list[BaseException],
    gaps: list[float] | None = None,
    stop: threading.Event | None = None,
    work: float = 0.002,
) -> None:
    """A worker's lease/settle loop on the tree crawl (run on a thread): each request
    processed (counted in ``processed``) pushes its children in the settle that acks it,
    through ``settle_begin`` when ``pipelined``; the seconds between settles that
    returned go to ``gaps``; it ends once the crawl has been finished for 20 polls, or at
    ``stop``. An exception is put in ``errors`` (the test reports it)."""
    try:
        last = time.monotonic()
        held = frontier.lease("w", BATCH)
        idle = 0
        while stop is None or not stop.is_set():
            for x in held:
                processed[int(x.envelope.url.rsplit("/", 1)[1])] += 1
            time.sleep(work)  # the "work"
            children = [c for x in held for c in _children(x)]
            if pipelined:
                out = frontier.settle_begin(push=children, ack=held, lease=("w", BATCH)).result()
            else:
                out = frontier.settle(push=children, ack=held, lease=("w", BATCH))
            now = time.monotonic()
            if gaps is not None:
                gaps.append(now - last)
            last = now
            held = out.leases
            if not held:
                idle = idle + 1 if frontier.counts().finished else 0
                if idle > 20:
                    return
                time.sleep(0.05)
    except BaseException as exc:  # reported by the test
        errors.append(exc)


@pytest.mark.parametrize(
    "backend,pipelined", [("lists", False), ("streams", False), ("lists", True)]
)
def test_a_master_killed_under_a_lease_ack_loop(
    tmp_path: Path, backend: str, pipelined: bool
) -> None:
    """``pipelined``: the settles go through ``settle_begin`` (the Scrapy scheduler's
    way: a raw connection to the crawl's master, which dies with it)."""
    with cluster.start(tmp_path / "cluster") as local:
        _run(local, backend, pipelined)


def _run(
    local: LocalCluster, backend: str, pipelined: bool = False, lag: float = 0.0
) -> dict[str, float]:
    """One run; ``lag`` (seconds): the victim's replica is frozen (SIGSTOP) that long
    before the master is killed, and resumed right after: replication lag made real."""
    settings = Settings(
        redis_url=local.url,
        backend=backend,  # type: ignore[arg-type]
        politeness=False,
        lease_ttl=5.0,
    )
    client = connect(settings)
    frontier = open_frontier(client, settings, "failover")
    frontier.check_vanished = True  # a crawl lost whole is an error, not "finished"
    frontier.push([_env(0)])
    processed: Counter[int] = Counter()
    gaps: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    worker = threading.Thread(
        target=tree_worker, args=(frontier, pipelined, processed, errors, gaps, stop)
    )
    worker.start()
    deadline = time.monotonic() + 60
    while sum(processed.values()) < N // 3:
        assert worker.is_alive() and time.monotonic() < deadline, errors
        time.sleep(0.005)
    victim = local.master_of(frontier.keys.req)
    replicas = local.replicas_of(victim)
    if lag:
        for r in replicas:
            os.kill(r.pid, signal.SIGSTOP)
        time.sleep(lag)
    killed_at = sum(processed.values())
    victim.stop()  # SIGKILL
    for r in replicas if lag else ():
        os.kill(r.pid, signal.SIGCONT)
    local.wait_ok(30)
    worker.join(120)
    stop.set()
    assert not errors, errors
    assert not worker.is_alive(), "the worker did not finish"

    c = frontier.counts()
    lost = [i for i in range(N) if processed[i] == 0]
    repeated = sum(n - 1 for n in processed.values() if n > 1)
    print(
        f"\nfailover ({backend}{', pipelined' if pipelined else ''}): killed the crawl's "
        f"master after {killed_at} processings; "
        f"lost {len(lost)}, repeated {repeated} (batch {BATCH}), longest stall "
        f"{max(gaps):.2f} s; counts after: {c}"
    )
    assert c.finished and c.conserved, c
    assert not lost, f"never processed: {lost[:10]}"
    assert c.done == N, c
    assert lag or repeated <= 4 * BATCH, repeated
    client.close()
    return {"lost": len(lost), "repeated": repeated, "stall": max(gaps), "killed_at": killed_at}
