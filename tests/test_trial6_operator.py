"""Trial 6: a stranger operating a fleet by the docs (README, deploy/README, docs/cli.md,
docs/api.md, docs/metrics.md). What it found, one test each."""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from redcrawl.codec import Envelope
from redcrawl.frontier import open_frontier
from redcrawl.metrics.collector import render
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.settings import Settings

from .apikit import AUTH_ADMIN, ApiServer, api_settings
from .conftest import RedisServer

SRC = Path(__file__).resolve().parents[1] / "src"


def _env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


def _crawls_in(text: str) -> set[str]:
    return {
        s.labels["crawl"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "redcrawl_requests" and "crawl" in s.labels
    }


def test_a_purged_crawl_leaves_the_metrics(redis7_client: redis.Redis) -> None:
    """`DELETE /v1/crawls/shop2` (or `redcrawl purge`): the crawl is gone from `crawls`,
    `GET /v1/crawls` and the dashboard, but `/metrics`, the exporter and `watch` went on
    exporting it as zeros forever (a purge keeps its stats hash for the id counters, and
    the metrics' crawl list only checked that the hash exists); each scrape of `serve`'s
    /metrics also wrote a dashboard history key for it again."""
    settings = Settings(politeness=False)
    for name in ("kept", "gone"):
        open_frontier(redis7_client, settings, name).push([_env(f"http://a.example/{name}")])
    reader = SnapshotReader(redis7_client, settings)
    assert _crawls_in(render(reader).decode()) == {"kept", "gone"}
    open_frontier(redis7_client, settings, "gone").purge()
    assert _crawls_in(render(reader).decode()) == {"kept"}
    # a fresh reader (the registry path, and the SCAN path once the registry is dropped)
    assert _crawls_in(render(SnapshotReader(redis7_client, settings)).decode()) == {"kept"}
    redis7_client.delete("rc:crawls")
    assert _crawls_in(render(SnapshotReader(redis7_client, settings)).decode()) == {"kept"}
    # pushed to again, it is back
    open_frontier(redis7_client, settings, "gone").push([_env("http://a.example/again")])
    assert _crawls_in(render(reader).decode()) == {"kept", "gone"}


class _NotRedis(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # (a Redis client's first bytes are no HTTP request)
        self.send_error(400)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    """A loopback port where an HTTP server answers: what REDIS_URL names when it has the
    wrong port (or a proxy's)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotRedis)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_redis_url_naming_a_server_that_is_not_redis_is_an_error_line(
    http_port: int, tmp_path: Path
) -> None:
    """`redcrawl status --redis-url redis://host:PORT/0` where PORT is an HTTP server (a
    wrong port; in the trial a black-holed address answered by a proxy): a 40-line
    traceback ending in `redis.exceptions.InvalidResponse: Protocol error, got "<" as reply
    type byte`, exit 1. `redcrawl crawl` and a `scrapy crawl` worker did the same."""
    url = f"redis://:s3cretPW@127.0.0.1:{http_port}/0"
    done = subprocess.run(
        [sys.executable, "-m", "redcrawl", "status", "--crawl", "c", "--redis-url", url],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"},
        timeout=60,
    )
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    assert done.returncode == 3, out
    assert "error:" in out and "not" in out and "Redis" in out, out
    assert "s3cretPW" not in out, out


@pytest.fixture
def api(redis7: RedisServer, redis7_client: redis.Redis) -> Iterator[httpx.Client]:
    server = ApiServer(api_settings(redis7.url), redis7_client)
    try:
        with httpx.Client(base_url=server.url, headers=AUTH_ADMIN, timeout=10) as c:
            yield c
    finally:
        server.stop()


def test_a_hosts_key_that_cannot_exist_is_a_404_that_reads(api: httpx.Client) -> None:
    """`GET /v1/crawls/shop/hosts/a%01b` answered 404 `no politeness key can be it has
    control characters; no politeness key has any`."""
    r = api.post("/v1/crawls/c/requests", json={"requests": [{"url": "http://a.test/"}]})
    assert r.status_code == 200, r.text
    for path in ("a%01b", "é" * 200):
        r = api.get(f"/v1/crawls/c/hosts/{path}")
        assert r.status_code == 404, r.text
        detail = r.json()["detail"]
        assert detail.startswith("no such politeness key: "), detail
        assert "can be it" not in detail, detail


def test_stop_embedded_while_in_use_names_the_flag_that_forces_it(tmp_path: Path) -> None:
    """`redcrawl stop-embedded` while a crawl uses the embedded Redis ended in `Stop them
    first, or force it`: with what, the user had to find in `--help`."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "300"}
    env.pop("REDCRAWL_REDIS_URL", None)
    user = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from redcrawl.connection import connect\n"
            "from redcrawl.settings import Settings\n"
            "connect(Settings()).ping()\n"
            "print('up', flush=True)\n"
            "time.sleep(60)\n",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert user.stdout is not None and user.stdout.readline() == "up\n"
        done = subprocess.run(
            [sys.executable, "-m", "redcrawl", "stop-embedded"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert f"pid {user.pid}" in out and "--force" in out, out
    finally:
        user.kill()
        user.communicate()
        subprocess.run(
            [sys.executable, "-m", "redcrawl", "stop-embedded", "--force"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=60,
        )
