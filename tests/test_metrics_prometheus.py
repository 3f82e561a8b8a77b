"""A real Prometheus server (Debian's package) scrapes ``/metrics`` of a live API while a
crawl is worked through the frontier; its HTTP API shows the backlog fall to zero and
done reach what was pushed, and it loads the shipped alert rules."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings

from .apikit import READ, ApiServer, api_settings
from .conftest import RedisServer, _free_port, need

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "alerts.yml"
PUSHED = 40


@pytest.fixture
def prometheus(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> Iterator[tuple[str, ApiServer]]:
    binary = shutil.which("prometheus")
    if binary is None:
        need("prometheus", "install Debian's prometheus package (scripts/test.sh does)")
    api = ApiServer(api_settings(redis7.url), redis7_client)
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{RULES}"]
scrape_configs:
  - job_name: redcrawl
    metrics_path: /metrics
    authorization: {{credentials: "{READ}"}}
    static_configs: [{{targets: ["127.0.0.1:{api.port}"]}}]
""")
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url, api
    finally:
        proc.terminate()
        proc.wait(10)
        api.stop()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)
    assert r.status_code == 200, r.text
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def scalar(url: str, expr: str) -> float | None:
    result = query(url, expr)
    return float(result[0]["value"][1]) if result else None


def wait_for(url: str, expr: str, want: float, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (got := scalar(url, expr)) != want:
        assert time.monotonic() < deadline, f"{expr} = {got}, waited for {want}"
        time.sleep(0.5)


def test_prometheus_sees_the_backlog_fall_to_zero(
    prometheus: tuple[str, ApiServer], redis7_client: redis.Redis
) -> None:
    url, _api = prometheus
    f = open_frontier(redis7_client, Settings(backend="lists"), "live")
    urls = [f"http://h{i % 4}.example/{i}" for i in range(PUSHED)]
    f.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls])
    wait_for(url, 'redcrawl_requests{crawl="live",state="ready"}', PUSHED)
    assert scalar(url, 'up{job="redcrawl"}') == 1
    while True:  # two workers take turns, slowly enough for a few scrapes in between
        for worker in ("w1", "w2"):
            f.ack(f.lease(worker, 4))
        if f.counts().finished:
            break
        time.sleep(0.3)
    wait_for(url, 'redcrawl_requests{crawl="live",state="ready"}', 0)
    wait_for(url, 'redcrawl_requests_done_total{crawl="live"}', PUSHED)
    assert scalar(url, 'redcrawl_requests{crawl="live",state="done"}') == PUSHED
    assert scalar(url, 'redcrawl_workers_alive{crawl="live"}') == 2
    # the backlog was seen falling: some scrapes saw part of it left
    series = query(url, 'redcrawl_requests{crawl="live",state="ready"}[5m]')
    values = [float(v) for _t, v in series[0]["values"]]
    assert any(0 < v < PUSHED for v in values), values
    assert values == sorted(values, reverse=True), values
    rules = httpx.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert {r["name"] for g in rules for r in g["rules"]} >= {"RedcrawlCrawlStalled"}
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
