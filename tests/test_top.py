"""``redcrawl top``: one frame with ``--once``; the live view ends cleanly on Ctrl-C."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
from rich.console import Console

from redcrawl.codec import Envelope
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.metrics.top import Top
from redcrawl.settings import Settings

from .conftest import RedisServer


def _crawl(client: redis.Redis) -> FrontierCore:
    f = open_frontier(client, Settings(max_attempts=1, retry_backoff=0.0), "shop")
    urls = [f"http://shop.example/{i}" for i in range(12)]
    f.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls])
    leased = f.lease("worker-1", 4)
    f.ack(leased[:2])
    f.nack(leased[2], "HTTP 500 from the shop", retry=False)
    return f


def _env(redis7: RedisServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    env.update(REDCRAWL_REDIS_URL=redis7.url, COLUMNS="160")
    return env


def test_top_once_prints_one_frame(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    _crawl(redis7_client)
    out = subprocess.run(
        [sys.executable, "-m", "redcrawl", "top", "--crawl", "shop", "--once"],
        cwd=tmp_path,
        env=_env(redis7),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "crawl shop (lists)" in text
    row = next(line for line in text.splitlines() if "│" in line and "8" in line)
    # ready 8 (12 - 4 leased), delayed 0, in flight 1 (4 - 2 done - 1 dead), accepted 12
    assert [c.strip() for c in row.split("│")[1:7]] == ["8", "0", "1", "2", "1", "12"], row
    assert "worker-1" in text and "alive" in text
    assert "HTTP 500 from the shop" in text


def test_top_of_an_unknown_crawl_says_so(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    _crawl(redis7_client)
    out = subprocess.run(
        [sys.executable, "-m", "redcrawl", "top", "--crawl", "nope", "--once"],
        cwd=tmp_path,
        env=_env(redis7),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "no crawl named 'nope'" in out.stderr and "shop" in out.stderr


def test_ctrl_c_ends_top_cleanly(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    f = _crawl(redis7_client)
    before = len(redis7_client.client_list())
    log = tmp_path / "top.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "redcrawl", "top", "--crawl", "shop", "--interval", "0.1"],
            cwd=tmp_path,
            env=_env(redis7),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        # running: it keeps reading the crawl (its client shows up in CLIENT LIST)
        while len(redis7_client.client_list()) <= before:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        f.ack(f.lease("worker-2", 2))
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "crawl shop" in text


def test_top_says_when_the_crawl_cannot_be_read(redis7_client: redis.Redis) -> None:
    _crawl(redis7_client)
    redis7_client.delete("rc:{shop}:delayed")
    redis7_client.set("rc:{shop}:delayed", "x")  # wrong type: counts can't be read
    out = io.StringIO()
    Top(SnapshotReader(redis7_client, Settings()), "shop").once(Console(file=out, width=120))
    assert "crawl shop: its state could not be read" in out.getvalue()
