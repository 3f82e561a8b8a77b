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
from redcrawl.politeness.hosts import Hosts
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


def _polite(client: redis.Redis) -> FrontierCore:
    """A crawl with politeness: a.test (5 ready, 2 in flight, its 2 slots full), b.test
    blocked by the operator, and a hostile download_slot."""
    s = Settings(politeness_concurrency=2, politeness_delay=0.0, politeness_randomize=False)
    f = open_frontier(client, s, "polite")
    envs = [
        Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest())
        for u in [f"http://a.test/{i}" for i in range(7)] + ["http://b.test/1"]
    ]
    hostile = "[bold red]<script>alert(1)</script>"
    envs.append(
        Envelope(
            url="http://c.test/x",
            fingerprint=hashlib.sha1(b"c").digest(),
            meta={"download_slot": hostile},
        )
    )
    f.push(envs)
    Hosts(f).set("b.test", block_for=600)
    Hosts(f).set(hostile, delay=2.5)
    leased = f.lease("worker-1", 3)
    assert sorted(lease.envelope.url.split("/")[2] for lease in leased) == [
        "a.test",
        "a.test",
        "c.test",
    ]
    return f


def test_top_shows_the_hosts_panel(redis7_client: redis.Redis) -> None:
    _polite(redis7_client)
    out = io.StringIO()
    Top(SnapshotReader(redis7_client, Settings()), "polite").once(Console(file=out, width=220))
    text = out.getvalue()
    assert "hosts: top 3 of 3 by ready" in text, text
    rows = {
        cells[0]: cells[1:]
        for line in text.splitlines()
        if "│" in line and (cells := [c.strip() for c in line.split("│")[1:-1]])
    }
    # key: ready, in flight, delay, concurrency, blocked until, why
    a = rows["a.test"]
    assert a[:4] == ["5", "2", "0 s", "2"] and a[4] == "", a
    assert a[5] == "all 2 slots in flight", a
    b = rows["b.test"]
    assert b[:4] == ["1", "0", "0 s", "2"] and b[4] != "", b
    assert b[5].startswith("blocked by operator until"), b
    # the hostile key is printed as it is, not read as rich markup
    c = rows["[bold red]<script>alert(1)</script>"]
    assert c[:4] == ["0", "1", "2.5 s", "2"], c
    assert c[5] == "no ready requests (1 in flight)", c
    # by in flight, a few keys
    out = io.StringIO()
    Top(SnapshotReader(redis7_client, Settings()), "polite", hosts=1, hosts_sort="inflight").once(
        Console(file=out, width=220)
    )
    assert "hosts: top 1 of 3 by in flight" in out.getvalue()
    assert "a.test" in out.getvalue() and "b.test" not in out.getvalue()


def test_top_without_politeness_has_no_hosts_panel(redis7_client: redis.Redis) -> None:
    f = open_frontier(redis7_client, Settings(backend="streams", politeness=False), "plain")
    f.push([Envelope(url="http://a.test/", fingerprint=hashlib.sha1(b"a").digest())])
    out = io.StringIO()
    Top(SnapshotReader(redis7_client, Settings()), "plain").once(Console(file=out, width=160))
    assert "crawl plain (streams)" in out.getvalue() and "hosts:" not in out.getvalue()


def test_the_hosts_panel_is_read_again_only_every_few_seconds(redis7_client: redis.Redis) -> None:
    f = _polite(redis7_client)
    view = Top(SnapshotReader(redis7_client, Settings()), "polite", hosts_every=3600)

    def frame() -> str:
        out = io.StringIO()
        view.once(Console(file=out, width=220))
        return out.getvalue()

    assert "b.test" in frame()
    Hosts(f).set("b.test", block_until=None)
    assert "blocked by operator" in frame()  # the panel of the first frame
    view.hosts_every = 0
    assert "blocked by operator" not in frame()
