"""Lease tokens across a real failover to a lagging replica (docs/cluster.md,
"Durability"): a lease the promoted replica never got leaves its worker holding a token
the new master must not hand out again. The same with a snapshot in place of the
failover, both backends: tests/test_gaps_durability.py."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings

from . import cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def envs(n: int) -> list[Envelope]:
    urls = [f"http://a{i}.example/" for i in range(n)]
    return [Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls]


def test_a_lease_lost_in_a_failover_leaves_no_token_to_reuse(tmp_path: Path) -> None:
    with cluster.start(tmp_path / "cluster") as local:
        settings = Settings(redis_url=local.url, politeness=False, lease_ttl=60.0)
        client = connect(settings)
        client.flushall()
        pusher = open_frontier(client, settings.replace(wait_replicas=1), "tokens")
        pusher.push(envs(4))
        assert pusher.replica_wait is not None and pusher.replica_wait.short == 0
        f = open_frontier(client, settings, "tokens")
        victim = local.master_of(f.keys.req)
        (replica,) = local.replicas_of(victim)
        os.kill(replica.pid, signal.SIGSTOP)  # frozen, and its link dropped: it gets
        with victim.client() as c:  # nothing from now on
            c.execute_command("CLIENT", "KILL", "TYPE", "replica")
        lost = f.lease("a", 2)
        assert len(lost) == 2
        victim.stop()  # SIGKILL
        os.kill(replica.pid, signal.SIGCONT)
        start = time.monotonic()
        while replica not in local.masters():
            assert time.monotonic() - start < 30, "the replica was not promoted"
            time.sleep(0.05)
        local.wait_ok(30)
        new = f.lease("b", 2)
        assert sorted(x.id for x in new) == sorted(x.id for x in lost)  # the same head
        assert not {x.token for x in new} & {x.token for x in lost}, (lost, new)
        assert f.nack(lost[0], "a's fetch failed", retry=False) == "stale"
        assert f.release(lost[1:]) == 0
        assert f.ack(new) == 2
        c = f.counts()
        assert (c.done, c.dead, c.ready, c.in_flight) == (2, 0, 2, 0), c
        client.close()
