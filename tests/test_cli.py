"""The redcrawl command, against a real Redis (and, for `demo`, real worker processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.frontier import ListsFrontier
from redcrawl.scrapy.pipelines import read_items
from redcrawl.settings import Settings

from .conftest import RedisServer

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture
def crawl(redis7_client: redis.Redis) -> ListsFrontier:
    return ListsFrontier(redis7_client, Settings(), "cli")


def test_seed_status_dead_requeue_purge(redis7: RedisServer, crawl: ListsFrontier,
                                        tmp_path: Path) -> None:
    url = redis7.url
    code, out = invoke("seed", "https://a.example/1", "https://a.example/2",
                       "--redis-url", url, "--crawl", "cli")
    assert code == 0 and "seeded 2" in out
    listing = tmp_path / "urls.txt"
    listing.write_text("https://a.example/2\nhttps://a.example/3\n\n")
    code, out = invoke("seed", "--file", str(listing), "--redis-url", url, "--crawl", "cli")
    assert code == 0 and "seeded 1" in out and "1 already known" in out
    assert crawl.counts().ready == 3

    code, out = invoke("status", "--json", "--redis-url", url, "--crawl", "cli")
    assert code == 0
    status = json.loads(out)
    assert (status["ready"], status["accepted"], status["finished"]) == (3, 3, False)

    for lease in crawl.lease("w", 3):
        crawl.dead_letter(lease, "HTTP 500 forever")
    code, out = invoke("dead", "--redis-url", url, "--crawl", "cli")
    assert code == 0 and out.count("HTTP 500 forever") == 3
    code, out = invoke("dead", "--requeue", "--redis-url", url, "--crawl", "cli")
    assert code == 0 and "requeued 3" in out
    assert (crawl.counts().dead, crawl.counts().ready) == (0, 3)

    code, out = invoke("purge", "--yes", "--redis-url", url, "--crawl", "cli")
    assert code == 0 and crawl.counts().accepted == 0


def test_seed_recrawl(redis7: RedisServer, crawl: ListsFrontier) -> None:
    args = ["seed", "https://a.example/1", "--redis-url", redis7.url, "--crawl", "cli"]
    assert "seeded 1" in invoke(*args)[1]
    crawl.ack(crawl.lease("w", 5))
    assert "seeded 0 URL(s); 1 already known" in invoke(*args)[1]
    assert "seeded 1" in invoke(*args, "--recrawl")[1]
    assert crawl.counts().ready == 1


def test_bad_input_is_a_clear_error_and_writes_nothing(redis7: RedisServer,
                                                       crawl: ListsFrontier) -> None:
    code, out = invoke("seed", "https://ok.example/", "ftp://nope/", "--redis-url", redis7.url,
                       "--crawl", "cli")
    assert code == 2 and "ftp://nope/" in out and "nothing was seeded" in out
    assert crawl.counts().accepted == 0
    code, out = invoke("status", "--redis-url", redis7.url)
    assert code == 2 and "--crawl" in out
    code, out = invoke("status", "--redis-url", redis7.url, "--crawl", "bad{name}")
    assert code == 2 and "crawl name" in out


def test_unreachable_redis_exit_code(redis7: RedisServer) -> None:
    code, out = invoke("status", "--redis-url", "redis://127.0.0.1:1/0", "--crawl", "x")
    assert code == 3 and "redis://127.0.0.1:1/0" in out


def test_purge_asks_first(redis7: RedisServer, crawl: ListsFrontier) -> None:
    invoke("seed", "https://a.example/1", "--redis-url", redis7.url, "--crawl", "cli")
    result = runner.invoke(app, ["purge", "--redis-url", redis7.url, "--crawl", "cli"],
                           input="n\n")
    assert result.exit_code == 1 and crawl.counts().accepted == 1


@pytest.mark.slow
def test_demo_command(tmp_path: Path) -> None:
    """README's main command, small: serves the shop, crawls it with 2 workers on the
    embedded Redis, reports, exits 0."""
    result = subprocess.run(
        [sys.executable, "-m", "redcrawl", "demo", "--workers", "2", "--products", "300",
         "--no-progress", "--dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = result.stdout
    assert "321 of 321" in report  # pages fetched (distinct) of canonical pages
    assert "conservation │ holds" in report.replace("  ", "")
    rows = read_items(f"sqlite:///{tmp_path / 'demo' / 'items.db'}")
    assert len(rows) == 300 and all(k.startswith("SKU-") for k in rows)
