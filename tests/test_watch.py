"""``redcrawl watch``: the alert rules evaluated on Redis, each transition POSTed once to a
webhook (a local HTTP sink here), a webhook that is down retried without a crash."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redcrawl.codec import Envelope
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.frontier.streams import shard_of
from redcrawl.metrics.rules import Thresholds
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.metrics.watch import Watchdog
from redcrawl.settings import Settings

from .conftest import Backend, RedisServer, _free_port


class Sink:
    """A webhook: a threaded HTTP server on ``port`` that keeps every JSON body POSTed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/hook"
        self.bodies: list[dict[str, Any]] = []
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> Sink:
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers["Content-Length"])
                bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def seen(self) -> list[tuple[str, str, dict[str, str]]]:
        return [(b["status"], b["alert"], b["labels"]) for b in self.bodies]


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink(_free_port()).start()
    yield s
    s.stop()


def push(f: FrontierCore, n: int, start: int = 0) -> None:
    urls = [f"http://h{i % 3}.example/{i}" for i in range(start, start + n)]
    f.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls])


def frontier(client: redis.Redis, crawl: str, backend: Backend = "lists") -> FrontierCore:
    return open_frontier(
        client, Settings(backend=backend, max_attempts=1, retry_backoff=0.0), crawl
    )


def dog(client: redis.Redis, url: str, **thresholds: Any) -> Watchdog:
    reader = SnapshotReader(client, Settings(lease_ttl=1.0))
    return Watchdog(reader, url, thresholds=Thresholds(**thresholds), timeout=2)


def test_stalled_crawl_fires_once_then_resolves(redis7_client: redis.Redis, sink: Sink) -> None:
    stalled, busy = frontier(redis7_client, "stalled"), frontier(redis7_client, "busy")
    push(stalled, 5)
    push(busy, 50)
    for f in (stalled, busy):
        f.renew("w1", ttl=60)
    d = dog(redis7_client, sink.url, stall_window=0.3, stall_for=0.0)
    d.poll()  # not watched long enough yet: quiet
    assert sink.seen() == []
    for _ in range(3):
        time.sleep(0.35)
        busy.ack(busy.lease("w1", 2))
        d.poll()
    stall = ("RedcrawlCrawlStalled", {"crawl": "stalled"})
    assert [(s, a, lab) for s, a, lab in sink.seen()] == [("firing", *stall)]  # once
    assert sink.bodies[0]["text"].startswith("[FIRING] RedcrawlCrawlStalled crawl=stalled:")
    stalled.ack(stalled.lease("w1", 1))
    d.poll()
    assert sink.seen() == [("firing", *stall), ("resolved", *stall)]
    assert sink.bodies[1]["text"].startswith("[RESOLVED] RedcrawlCrawlStalled")


def test_lost_heartbeat_with_leases_out_fires(redis7_client: redis.Redis, sink: Sink) -> None:
    f = frontier(redis7_client, "c")
    push(f, 6)
    f.lease("gone", 2, ttl=1.0)  # its heartbeat deadline: now + 1 s (the reader's ttl)
    f.renew("alive", ttl=60)
    idle = frontier(redis7_client, "idle")
    push(idle, 1)
    idle.renew("gone-idle", ttl=1.0)  # lost too, but that crawl has nothing in flight
    d = dog(redis7_client, sink.url, heartbeat_lost=0.5)
    d.poll()
    assert sink.seen() == []
    time.sleep(0.7)
    d.poll()
    assert sink.seen() == [
        ("firing", "RedcrawlWorkerHeartbeatLost", {"crawl": "c", "worker": "gone"})
    ]


def test_backlog_dead_letters_and_pending_age(redis7_client: redis.Redis, sink: Sink) -> None:
    growing, draining = frontier(redis7_client, "growing"), frontier(redis7_client, "draining")
    streams = frontier(redis7_client, "s", backend="streams")
    push(growing, 20)
    push(draining, 20)
    push(streams, 2)
    d = dog(
        redis7_client,
        sink.url,
        backlog=10,
        backlog_window=0.3,
        backlog_for=0.0,
        dead_window=0.3,
        dead_for=0.0,
        pending_age=0.5,
    )
    d.poll()
    held = streams.lease("w", 1)
    shard = str(shard_of(held[0].envelope.url, streams.settings.shards))
    assert sink.seen() == []
    time.sleep(0.6)
    push(growing, 5, start=100)
    draining.ack(draining.lease("w", 5))
    growing.nack(growing.lease("w", 1)[0], "boom", retry=False)
    d.poll()
    got = {(a, tuple(sorted(lab.items()))) for s, a, lab in sink.seen() if s == "firing"}
    assert got == {
        ("RedcrawlBacklogHigh", (("crawl", "growing"),)),
        ("RedcrawlDeadLettersGrowing", (("crawl", "growing"),)),
        ("RedcrawlStreamPendingOld", (("crawl", "s"), ("shard", shard), ("stream", "low"))),
    }, sink.seen()
    streams.ack(held)
    d.poll()
    assert (
        "resolved",
        "RedcrawlStreamPendingOld",
        {"crawl": "s", "shard": shard, "stream": "low"},
    ) in sink.seen()


def test_redis_memory_over_80_percent(redis7_client: redis.Redis, sink: Sink) -> None:
    d = dog(redis7_client, sink.url, memory_for=0.0)
    d.poll()
    assert sink.seen() == []
    used = int(redis7_client.info("memory")["used_memory"])
    try:
        redis7_client.config_set("maxmemory", str(int(used * 1.1)))
        d.poll()
        redis7_client.config_set("maxmemory", "0")
        d.poll()
    finally:
        redis7_client.config_set("maxmemory", "0")
    assert sink.seen() == [
        ("firing", "RedcrawlRedisMemoryHigh", {}),
        ("resolved", "RedcrawlRedisMemoryHigh", {}),
    ]


def test_a_partition_that_lost_its_state(redis7_client: redis.Redis, sink: Sink) -> None:
    """A partitioned crawl's partition is emptied (its master came back empty): the alert
    fires at once, the exported gauge says 1, and ``accept_loss`` resolves it."""
    from redcrawl.metrics.collector import families

    f = open_frontier(redis7_client, Settings(partitions=4), "parts")
    push(f, 30)
    d = dog(redis7_client, sink.url)
    d.poll()
    assert sink.seen() == []
    keys = list(redis7_client.scan_iter(match="rc:{parts/1}:*"))
    assert keys
    redis7_client.delete(*keys)
    d.poll()
    gauge = {
        s.labels["crawl"]: s.value
        for fam in families(SnapshotReader(redis7_client, Settings()).read())
        if fam.name == "redcrawl_partitions_lost"
        for s in fam.samples
    }
    assert gauge == {"parts": 1}
    f.accept_loss()
    d.poll()
    assert sink.seen() == [
        ("firing", "RedcrawlPartitionsLost", {"crawl": "parts"}),
        ("resolved", "RedcrawlPartitionsLost", {"crawl": "parts"}),
    ]


def test_a_webhook_that_is_down_is_retried_and_gets_each_transition_once(
    redis7_client: redis.Redis,
) -> None:
    sink = Sink(_free_port())  # not listening yet: connection refused
    used = int(redis7_client.info("memory")["used_memory"])
    d = dog(redis7_client, sink.url, memory_for=0.0)
    try:
        redis7_client.config_set("maxmemory", str(int(used * 1.1)))
        d.poll()
        d.poll()  # down: kept, retried, no crash, not queued twice
        assert len(d.outbox) == 1
        sink.start()
        d.poll()
        d.poll()
        assert sink.seen() == [("firing", "RedcrawlRedisMemoryHigh", {})]
        assert not d.outbox
    finally:
        redis7_client.config_set("maxmemory", "0")
        sink.stop()


def test_redis_down_does_not_stop_the_watchdog(sink: Sink) -> None:
    client = redis.Redis(port=_free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    d = Watchdog(SnapshotReader(client, Settings()), sink.url)
    d.poll()
    d.poll()
    assert sink.seen() == []
    client.close()


def test_watch_command_posts_to_the_webhook(
    redis7: RedisServer, redis7_client: redis.Redis, sink: Sink, tmp_path: Path
) -> None:
    push(frontier(redis7_client, "shop"), 3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    used = int(redis7_client.info("memory")["used_memory"])
    try:
        redis7_client.config_set("maxmemory", str(int(used * 1.5)))
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "redcrawl",
                "watch",
                "--webhook",
                sink.url,
                "--redis-url",
                redis7.url,
                "--interval",
                "0.1",
                "--polls",
                "2",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        redis7_client.config_set("maxmemory", "0")
    assert out.returncode == 0, out.stderr
    assert sink.seen() == []  # memory_for is 5 minutes: nothing fires in two polls
