"""Durability on replicated Redis (docs/cluster.md, "Durability"):

- ``REDCRAWL_WAIT_REPLICAS``: each state-changing call returns only once the replicas
  have it (read back from the replica right after the call), on one server with a
  replica and on the cluster, plain and pipelined settles; with too few replicas the
  call goes on after ``REDCRAWL_WAIT_TIMEOUT`` with a warning and a count, not an error.
- A crawl whose state vanished under a worker (a failover onto an empty replica, a
  flush, a purge by someone else) raises :class:`CrawlVanished` where the worker would
  have found it finished: under a frontier (both backends) and under a real Scrapy
  worker, which closes with reason ``crawl_vanished`` and exit code 1.

The failover of a whole Scrapy fleet is in tests/test_cluster_failover_scrapy.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.errors import CrawlVanished, FrontierError
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.redis_server import LocalCluster, RedisServer
from redcrawl.settings import Settings
from redcrawl.workers import worker_command

from . import cluster
from .conftest import Backend, FrontierFactory, redis_binary
from .sitekit import SiteSpec, serving

ROOT = Path(__file__).resolve().parent.parent
SITEKIT = Path(__file__).with_name("sitekit.py")


def _envs(n: int, start: int = 0) -> list[Envelope]:
    return [
        Envelope(url=f"http://site/{i}", fingerprint=hashlib.sha1(b"%d" % i).digest())
        for i in range(start, start + n)
    ]


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis 7 server with one replica (the replica is its ``.replica``)."""
    binary = redis_binary("7")
    master = RedisServer(binary, tmp_path_factory.mktemp("master"))
    replica = RedisServer(
        binary,
        tmp_path_factory.mktemp("replica"),
        extra=["--replicaof", "127.0.0.1", str(master.port), "--repl-diskless-sync-delay", "0"],
    )
    with master.client() as c:
        deadline = time.monotonic() + 30
        while int(c.execute_command("WAIT", 1, 100)) < 1:
            assert time.monotonic() < deadline, "the replica never synced"
    master.replica = replica  # type: ignore[attr-defined]
    yield master
    replica.stop()
    master.stop()


def _stats_on(client: redis.Redis, f: FrontierCore) -> dict[bytes, bytes]:
    return client.hgetall(f.keys.stats)  # type: ignore[return-value]


# --- REDCRAWL_WAIT_REPLICAS ------------------------------------------------------------
@pytest.mark.parametrize("pipelined", [False, True])
def test_each_call_returns_once_the_replica_has_it(
    replicated: RedisServer, pipelined: bool
) -> None:
    settings = Settings(redis_url=replicated.url, wait_replicas=1, politeness=False)
    client = connect(settings)
    client.flushall()
    f = open_frontier(client, settings, "waited")
    replica: RedisServer = replicated.replica  # type: ignore[attr-defined]
    with replica.client() as r:
        f.push(_envs(30))
        assert _stats_on(r, f)[b"accepted"] == b"30"
        held = f.lease("w", 10)
        assert _stats_on(r, f) == _stats_on(client, f)
        for _ in range(3):
            if pipelined:
                out = f.settle_begin(push=_envs(2, 100), ack=held, lease=("w", 10)).result()
            else:
                out = f.settle(push=_envs(2, 100), ack=held, lease=("w", 10))
            # the ack is on the replica before the call returns: nothing to wait for
            assert _stats_on(r, f) == _stats_on(client, f)
            held = out.leases
    assert f.replica_wait is not None
    assert f.replica_wait.short == 0 and f.replica_wait.calls >= 5
    client.close()


def test_a_server_without_the_scripts_runs_the_waited_call_once(
    replicated: RedisServer,
) -> None:
    """The waited call sends EVALSHA without checking first: after SCRIPT FLUSH (a
    restart, a promoted replica) it loads the script and runs the call, once."""
    settings = Settings(redis_url=replicated.url, wait_replicas=1, politeness=False)
    client = connect(settings)
    client.flushall()
    f = open_frontier(client, settings, "noscript")
    f.push(_envs(3))
    client.script_flush()
    assert f.push(_envs(5)).accepted == 2  # 3 known: pushed once, not twice
    held = f.lease("w", 5)
    client.script_flush()
    assert f.settle(ack=held).acked == 5
    assert f.counts().done == 5 and f.counts().accepted == 5
    assert f.replica_wait is not None and f.replica_wait.short == 0
    client.close()


def test_a_call_waits_for_a_lagging_replica(replicated: RedisServer) -> None:
    """The replica frozen (SIGSTOP): the settle does not return until it is resumed and
    has acknowledged; without WAIT it returns at once."""
    replica: RedisServer = replicated.replica  # type: ignore[attr-defined]
    returned: dict[int, float] = {}
    for wait in (0, 1):
        settings = Settings(
            redis_url=replicated.url, wait_replicas=wait, wait_timeout=10, politeness=False
        )
        client = connect(settings)
        client.flushall()
        f = open_frontier(client, settings, f"lag{wait}")
        f.push(_envs(5))
        held = f.lease("w", 5)
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            call = threading.Thread(target=f.settle, kwargs={"ack": held})
            call.start()
            call.join(0.5)
            returned[wait] = time.monotonic() - start if not call.is_alive() else -1
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        call.join(10)
        assert not call.is_alive()
        assert f.counts().done == 5
        client.close()
    assert 0 <= returned[0] < 0.5, returned  # no WAIT: back at once
    assert returned[1] == -1, returned  # WAIT 1: still waiting for the frozen replica


def test_too_few_replicas_is_a_warning_and_a_count_not_a_failure(
    redis7: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The session's Redis 7 has no replica: every WAIT times out, the calls go on."""
    settings = Settings(redis_url=redis7.url, wait_replicas=1, wait_timeout=0.05, politeness=False)
    client = connect(settings)
    client.flushall()
    f = open_frontier(client, settings, "alone")
    with caplog.at_level(logging.WARNING, logger="redcrawl.frontier.durability"):
        start = time.monotonic()
        f.push(_envs(5))
        out = f.settle(ack=f.lease("w", 5), lease=("w", 5))
        assert time.monotonic() - start >= 0.1  # three WAITs of 0.05 s
    assert out.acked == 5 and f.counts().done == 5
    assert f.replica_wait is not None and f.replica_wait.short == 3
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once a minute at most
    assert "before 1 replica(s) had their writes" in warnings[0]
    assert "REDCRAWL_WAIT_TIMEOUT" in warnings[0]
    client.close()


def test_wait_replicas_off_sends_no_wait(redis7: RedisServer) -> None:
    settings = Settings(redis_url=redis7.url, politeness=False)
    client = connect(settings)
    f = open_frontier(client, settings, "nowait")
    assert f.replica_wait is None
    start = time.monotonic()
    f.push(_envs(5))
    assert time.monotonic() - start < 1.0
    client.close()


@pytest.mark.cluster
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_on_the_cluster_the_wait_goes_to_the_crawls_master(
    redis_cluster: LocalCluster, backend: str
) -> None:
    settings = Settings(
        redis_url=redis_cluster.url,
        backend=backend,  # type: ignore[arg-type]
        wait_replicas=1,
        politeness=False,
    )
    client = cluster.client(redis_cluster)
    f = open_frontier(client, settings, f"waited-{backend}")
    f.push(_envs(30))
    held = f.lease("w", 10)
    held = f.settle(push=_envs(3, 100), ack=held, lease=("w", 10)).leases
    held = f.settle_begin(push=_envs(3, 200), ack=held, lease=("w", 10)).result().leases
    (replica,) = redis_cluster.replicas_of(redis_cluster.master_of(f.keys.stats))
    with replica.client() as r:
        r.execute_command("READONLY")
        assert _stats_on(r, f) == _stats_on(client, f)
    assert f.replica_wait is not None
    assert f.replica_wait.short == 0 and f.replica_wait.calls >= 4
    client.close()


# --- a crawl that vanished -------------------------------------------------------------
def test_a_crawl_flushed_under_a_frontier_is_not_finished(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    """What a failover onto an empty replica looks like: everything gone; the worker's
    next lease recreates the crawl's layout (empty), and its counts are 'finished'."""
    f = make_frontier("gone")
    f.check_vanished = True  # (a worker's frontier: the Scrapy scheduler's is)
    f.push(_envs(10))
    held = f.lease("w", 5)
    redis_client.flushall()
    out = f.settle(ack=held, lease=("w", 5))  # stale acks; the layout is stored again
    assert out.acked == 0 and not out.leases
    with pytest.raises(CrawlVanished) as caught:
        f.counts()
    assert isinstance(caught.value, FrontierError)
    message = str(caught.value)
    assert "crawl 'gone' vanished" in message and "rc:{gone}:control" in message
    assert "REDCRAWL_WAIT_REPLICAS" in message and "seed the crawl again" in message


def test_the_control_key_deleted_under_a_running_frontier(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    """Only the control hash gone (its identity with it): found when the crawl finishes."""
    f = make_frontier("ctl")
    f.check_vanished = True
    f.push(_envs(4))
    held = f.lease("w", 4)
    redis_client.delete(f.keys.control)
    assert not f.counts().finished  # still in flight: no check yet
    f.ack(held)
    with pytest.raises(CrawlVanished, match="is gone, or was created again"):
        f.counts()


def test_a_crawl_created_again_by_another_worker_is_told_apart(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    f = make_frontier("again")
    f.check_vanished = True
    f.ack(f.settle(push=_envs(2), lease=("w", 2)).leases)
    assert f.counts().finished  # this worker's own crawl: finished
    redis_client.flushall()
    other = make_frontier("again")
    other.check_vanished = True
    other.ack(other.settle(push=_envs(1), lease=("v", 1)).leases)
    assert other.counts().finished  # the new crawl's worker knows no other
    with pytest.raises(CrawlVanished, match="belongs to a crawl created since"):
        f.counts()


def test_readers_pushers_and_an_own_purge_are_not_a_vanished_crawl(
    make_frontier: FrontierFactory, redis_client: redis.Redis
) -> None:
    """Only a worker's frontier (``check_vanished``) that leased from the crawl checks:
    not one that only reads or pushes (the API, ``redcrawl seed``), nor one that leases
    without the flag (a tool, a test); a worker's own purge starts it afresh."""
    reader = make_frontier("mine")
    pusher = make_frontier("mine")
    pusher.check_vanished = True
    tool = make_frontier("mine")
    assert reader.counts().finished  # never worked on it: no identity, no check
    pusher.push(_envs(3))
    f = make_frontier("mine")
    f.check_vanished = True
    f.ack(f.lease("w", 2))
    tool.ack(tool.lease("t", 1))
    assert f.counts().finished and reader.counts().finished
    f.purge()
    assert f.counts().finished  # its own purge: a new crawl from now on
    pusher.push(_envs(3))  # accepted again: the purge removed the fingerprints
    f.ack(f.lease("w", 3))
    assert f.counts().finished and f.counts().done == 3
    redis_client.flushall()
    assert reader.counts().finished and pusher.counts().finished
    assert tool.counts().finished
    with pytest.raises(CrawlVanished):
        f.counts()


def test_a_purge_by_another_process_under_a_worker_is_loud(
    make_frontier: FrontierFactory,
) -> None:
    """An operator's purge under a running worker: the worker does not report the crawl
    finished either (its message says what to do if the purge was meant)."""
    f = make_frontier("purged")
    f.check_vanished = True
    f.ack(f.settle(push=_envs(2), lease=("w", 2)).leases)
    make_frontier("purged").purge()
    with pytest.raises(CrawlVanished, match="if someone purged it on purpose, stop its"):
        f.counts()


def test_a_scrapy_worker_closes_with_crawl_vanished(
    redis7: RedisServer, tmp_path: Path, frontier_backend: Backend
) -> None:
    """A real worker crawling slow loopback sites; its Redis is flushed mid-crawl (an
    empty replica promoted). It does not report the crawl finished: it closes with
    reason crawl_vanished and exit code 1, the message in its log."""
    client = redis7.client()
    client.flushall()
    crawl = "vanish"
    reader = open_frontier(client, Settings(backend=frontier_backend), crawl)
    sites = [SiteSpec(pages=8, links=2, delay=0.1) for _ in range(2)]
    log = tmp_path / "w.log"
    with serving(sites) as kit:
        cmd = worker_command(
            SITEKIT,
            settings=[
                "CONCURRENT_REQUESTS=4",
                "ROBOTSTXT_OBEY=False",
                "RETRY_ENABLED=False",
                "TELNETCONSOLE_ENABLED=False",
                "LOG_LEVEL=INFO",
                "REDCRAWL_LEASE_TTL=3",
                "REDCRAWL_IDLE_BEFORE_CLOSE=0.5",
            ],
            spider_args={"urls": ",".join(kit.roots)},
        )
        env = {
            **os.environ,
            "REDCRAWL_REDIS_URL": redis7.url,
            "REDCRAWL_CRAWL": crawl,
            "REDCRAWL_BACKEND": frontier_backend,
            "PYTHONPATH": str(ROOT / "src"),
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.DEVNULL, stderr=out, start_new_session=True
            )
        try:
            deadline = time.monotonic() + 60
            while reader.counts().done < 3:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.02)
            client.flushall()
            rc = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = log.read_text()
    assert rc == 1, text[-3000:]
    assert "reason 'crawl_vanished'" in text, text[-3000:]
    assert "crawl 'vanish' vanished while this worker was working on it" in text
    client.close()
