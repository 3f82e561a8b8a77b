"""The redcrawl command, against a real Redis (and, for `demo`, real worker processes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.connection import stop_embedded
from redcrawl.embedded import _embedded as embedded_users
from redcrawl.frontier import FrontierCore, ListsFrontier
from redcrawl.scrapy.pipelines import read_items
from redcrawl.settings import Settings

from .conftest import RedisServer

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture
def crawl(redis7_client: redis.Redis) -> FrontierCore:
    return ListsFrontier(redis7_client, Settings(), "cli")


def test_seed_status_dead_requeue_purge(
    redis7: RedisServer, crawl: FrontierCore, tmp_path: Path
) -> None:
    url = redis7.url
    code, out = invoke(
        "seed", "https://a.example/1", "https://a.example/2", "--redis-url", url, "--crawl", "cli"
    )
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


def test_seed_recrawl(redis7: RedisServer, crawl: FrontierCore) -> None:
    args = ["seed", "https://a.example/1", "--redis-url", redis7.url, "--crawl", "cli"]
    assert "seeded 1" in invoke(*args)[1]
    crawl.ack(crawl.lease("w", 5))
    assert "seeded 0 URL(s); 1 already known" in invoke(*args)[1]
    assert "seeded 1" in invoke(*args, "--recrawl")[1]
    assert crawl.counts().ready == 1


@pytest.mark.parametrize(
    "bad,words",
    [
        ("http://exa mple.com/", "whitespace"),
        ("http://a\x00b.example/", "control"),
        ("http:///no-host", "no host"),
        ("file:///etc/passwd", "http"),
    ],
)
def test_seed_refuses_urls_with_bad_hosts_and_stores_nothing(
    redis7: RedisServer, crawl: FrontierCore, bad: str, words: str
) -> None:
    code, out = invoke(
        "seed", "https://ok.example/", bad, "--redis-url", redis7.url, "--crawl", "cli"
    )
    assert code == 2 and words in out and "nothing was seeded" in out, out
    assert crawl.counts().accepted == 0


def test_seed_refuses_a_framework_callback(redis7: RedisServer, crawl: FrontierCore) -> None:
    code, out = invoke(
        "seed",
        "https://ok.example/",
        "--callback",
        "_set_crawler",
        "--redis-url",
        redis7.url,
        "--crawl",
        "cli",
    )
    assert code == 2 and "private" in out and crawl.counts().accepted == 0


def test_bad_input_is_a_clear_error_and_writes_nothing(
    redis7: RedisServer, crawl: FrontierCore
) -> None:
    code, out = invoke(
        "seed", "https://ok.example/", "ftp://nope/", "--redis-url", redis7.url, "--crawl", "cli"
    )
    assert code == 2 and "ftp://nope/" in out and "nothing was seeded" in out
    assert crawl.counts().accepted == 0
    code, out = invoke("status", "--redis-url", redis7.url)
    assert code == 2 and "--crawl" in out
    code, out = invoke("status", "--redis-url", redis7.url, "--crawl", "bad{name}")
    assert code == 2 and "crawl name" in out


def test_unreachable_redis_exit_code(redis7: RedisServer) -> None:
    code, out = invoke("status", "--redis-url", "redis://127.0.0.1:1/0", "--crawl", "elsewhere")
    assert code == 3 and "redis://127.0.0.1:1/0" in out


def test_purge_asks_first(redis7: RedisServer, crawl: FrontierCore) -> None:
    invoke("seed", "https://a.example/1", "--redis-url", redis7.url, "--crawl", "cli")
    result = runner.invoke(app, ["purge", "--redis-url", redis7.url, "--crawl", "cli"], input="n\n")
    assert result.exit_code == 1 and crawl.counts().accepted == 1
    assert "not purged: crawl cli is left as it was" in result.output, result.output


@pytest.mark.slow
@pytest.mark.parametrize("user_env", [{}, {"REDCRAWL_PARTITIONS": "2"}], ids=["plain", "env"])
def test_demo_command(tmp_path: Path, user_env: dict[str, str]) -> None:
    """README's main command, small: serves the shop, crawls it with 2 workers on the
    embedded Redis, serves the dashboard while it runs (its address printed), reports,
    exits 0. ``env``: a user's REDCRAWL_* variables apply to the demo as to its workers
    (a partition count the demo ignored made it report 0 requests done)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redcrawl",
            "demo",
            "--workers",
            "2",
            "--products",
            "300",
            "--no-progress",
            "--dir",
            str(tmp_path / "demo"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **user_env, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # the dashboard's address comes before the crawl
            lines.append(line)
            if line.startswith("dashboard: "):
                break
        board = lines[-1].removeprefix("dashboard: ").strip()
        assert board.startswith("http://127.0.0.1:") and board.endswith("/"), lines
        with urllib.request.urlopen(board, timeout=10) as page:  # served while it crawls
            assert page.status == 200 and "redcrawl" in page.read().decode()
        rest, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, rest[-3000:] + err[-3000:]
    report = "".join(lines) + rest
    assert "321 of 321" in report  # pages fetched (distinct) of canonical pages
    assert "conservation │ holds" in report.replace("  ", "")
    assert re.search(r"requests done\s*│\s*321\s", report), report
    rows = read_items(f"sqlite:///{tmp_path / 'demo' / 'items.db'}")
    assert len(rows) == 300 and all(k.startswith("SKU-") for k in rows)
    with pytest.raises(OSError):  # stopped with the demo
        urllib.request.urlopen(board, timeout=2)


# --- inspection never starts a server; default crawl; states ---------------------------


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with no crawl in it, as the current directory, no Redis URL set."""
    monkeypatch.chdir(tmp_path)
    for name in ("REDCRAWL_REDIS_URL", "REDCRAWL_CRAWL", "REDIS_URL", "SCRAPY_SETTINGS_MODULE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.mark.parametrize(
    "command",
    [
        ["status", "--crawl", "x"],
        ["dead", "--crawl", "x"],
        ["crawls"],
        ["pause", "--crawl", "x"],
        ["purge", "--yes", "--crawl", "x"],
        ["status"],
    ],
)
def test_inspection_elsewhere_starts_no_embedded_redis(elsewhere: Path, command: list[str]) -> None:
    """Run from another folder, an inspection command says it found no crawl state
    there, exits non-zero and leaves no .redcrawl folder behind (it used to start a fresh
    empty server and report the crawl finished)."""
    code, out = invoke(*command)
    where = elsewhere / ".redcrawl"
    assert code == 3, out
    assert f"no crawl state found at {where}" in " ".join(out.split())
    assert "REDCRAWL_REDIS_URL" in out
    assert not where.exists()


def test_status_of_the_embedded_redis_names_its_socket(elsewhere: Path) -> None:
    from redcrawl.connection import EmbeddedRedis

    server = EmbeddedRedis(elsewhere / ".redcrawl")
    server.start()
    try:
        code, out = invoke("seed", "https://a.example/", "--crawl", "emb")
        assert code == 0, out
        code, out = invoke("status")  # the only crawl there
        assert code == 0, out
        assert f"redis-cli -s {server.socket}" in out
        assert "stopped (no live workers)" in out
    finally:
        server.stop()
        # the commands above ran in this process and joined the server as its user too
        # (it is stopped at this process's exit, which xdist's workers skip: it leaked)
        user = embedded_users.pop((elsewhere / ".redcrawl").resolve(), None)
        if user is not None:
            user.stop()
    # stopped, its data on disk: status reads it (starting a server for itself, in a
    # process of its own so that the server goes away with it)
    assert not stop_embedded(Settings(embedded_dir=elsewhere / ".redcrawl"))  # not running
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    result = subprocess.run(
        [sys.executable, "-m", "redcrawl", "status", "--crawl", "emb", "--json"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ready"] == 1


def test_status_states_duplicates_and_default_crawl(
    redis7: RedisServer, crawl: FrontierCore
) -> None:
    url = redis7.url
    invoke(
        "seed", "https://a.example/1", "https://a.example/2", "--redis-url", url, "--crawl", "cli"
    )
    code, out = invoke("status", "--redis-url", url)  # the only crawl in this Redis
    assert code == 0 and "crawl cli" in out and "stopped (no live workers)" in out
    crawl.lease("w1", 1)  # a live worker
    crawl.add_stats(filtered_local=7)
    code, out = invoke("status", "--redis-url", url, "--crawl", "cli")
    assert "running (1 live worker)" in out
    assert "7 (0 in Redis, 7 in the workers)" in out
    invoke("pause", "--redis-url", url, "--crawl", "cli")
    assert crawl.is_paused()
    status = json.loads(invoke("status", "--json", "--redis-url", url, "--crawl", "cli")[1])
    assert status["state"] == "paused (1 live worker)" and status["filtered_local"] == 7
    code, out = invoke("resume", "--redis-url", url, "--crawl", "cli")
    assert code == 0 and not crawl.is_paused()

    invoke("seed", "https://b.example/", "--redis-url", url, "--crawl", "other")
    code, out = invoke("crawls", "--redis-url", url)
    assert code == 0 and "cli" in out and "other" in out
    code, out = invoke("status", "--redis-url", url)  # two crawls: which one?
    assert code == 2 and "--crawl NAME" in out and "cli, other" in out
    code, out = invoke("status", "--redis-url", url, "--crawl", "nope")
    assert code == 1 and "no crawl named 'nope'" in out


def test_dead_letters_show_when_they_died(redis7: RedisServer, crawl: FrontierCore) -> None:
    import re

    invoke("seed", "https://a.example/1", "--redis-url", redis7.url, "--crawl", "cli")
    for lease in crawl.lease("w", 1):
        crawl.dead_letter(lease, "HTTP 500 forever")
    code, out = invoke("dead", "--redis-url", redis7.url, "--crawl", "cli")
    assert code == 0
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ  \S+  https://a.example/1  attempts=", out), (
        out
    )


PROJECT_SPIDER = """
import scrapy


class One(scrapy.Spider):
    name = "only"
"""


@pytest.fixture
def project(elsewhere: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Scrapy project with one spider, ``only``, as the current directory."""
    (elsewhere / "scrapy.cfg").write_text("[settings]\ndefault = rcproj.settings\n")
    pkg = elsewhere / "rcproj"
    (pkg / "spiders").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "spiders" / "__init__.py").write_text("")
    (pkg / "spiders" / "one.py").write_text(PROJECT_SPIDER)
    (pkg / "settings.py").write_text('SPIDER_MODULES = ["rcproj.spiders"]\n')
    monkeypatch.syspath_prepend(str(elsewhere))
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "rcproj.settings")
    for name in [m for m in sys.modules if m.split(".")[0] == "rcproj"]:  # an earlier test's
        monkeypatch.delitem(sys.modules, name)
    return elsewhere


def test_wrong_spider_name_lists_the_spiders(project: Path) -> None:
    """Checked before any worker starts: exit 2 with the project's spiders, nothing made."""
    code, out = invoke("crawl", "nosuch", "--workers", "3")
    assert code == 2 and "no spider named 'nosuch'" in out and "only" in out
    code, out = invoke("crawl", "missing.py")
    assert code == 2 and "missing.py does not exist" in out
    assert not (project / ".redcrawl").exists()


def test_wrong_spider_outside_a_project(elsewhere: Path) -> None:
    code, out = invoke("crawl", "myspider")
    assert code == 2 and "not a Scrapy project" in " ".join(out.split())


def test_default_crawl_is_the_projects_only_spider(
    project: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    code, out = invoke("seed", "https://a.example/", "--redis-url", redis7.url)
    assert code == 0, out
    assert ListsFrontier(redis7_client, Settings(), "only").counts().ready == 1


def test_progress_line_does_not_wrap_at_80_columns() -> None:
    import io

    from rich.console import Console

    from redcrawl.frontier import Counts
    from redcrawl.progress import ProgressDisplay
    from redcrawl.workers import Tick

    sink = io.StringIO()
    display = ProgressDisplay(Console(file=sink, width=80, force_terminal=True))
    big = Counts(
        accepted=12_345_678,
        filtered=9_999_999,
        ready=1_234_567,
        delayed=12_345,
        in_flight=256,
        done=10_000_000,
        dead=1_234,
        retried=99_999,
    )
    display(Tick(big, {"items": 9_876_543}, 3725.0, 4))
    display.console.print(display.progress.get_renderable())
    lines = sink.getvalue().rstrip("\n").split("\n")
    assert len(lines) == 1, lines
    assert "10,000,000 pages" in lines[0]


@pytest.mark.slow
def test_fail_on_dead(redis7: RedisServer, tmp_path: Path) -> None:
    """A crawl that ends with dead letters exits 4 with --fail-on-dead (0 without)."""
    from redcrawl.demo.run import SPIDER, demo_worker_settings
    from redcrawl.demo.site import ShopSite, SiteConfig

    redis.Redis.from_url(redis7.url).flushall()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    env.update(REDCRAWL_REDIS_URL=redis7.url, COLUMNS="200")
    with ShopSite(SiteConfig(products=30, always_fail=(7,))) as site:
        cmd = [
            sys.executable,
            "-m",
            "redcrawl",
            "crawl",
            str(SPIDER),
            "--workers",
            "1",
            "--crawl",
            "fod",
            "--arg",
            f"url={site.url}",
            "--no-progress",
            "--fail-on-dead",
        ]
        for item in [*demo_worker_settings(tmp_path / "items.db"), "REDCRAWL_RETRY_BACKOFF=0.1"]:
            cmd += ["--set", item]
        result = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100
        )
    assert result.returncode == 4, result.stderr[-3000:]
    assert "1 dead letter(s)" in result.stderr


def test_seed_without_a_crawl_name_makes_nothing(elsewhere: Path) -> None:
    code, out = invoke("seed", "https://a.example/")
    assert code == 2 and "--crawl NAME" in out
    assert not (elsewhere / ".redcrawl").exists()


def test_status_in_a_project_of_several_spiders_picks_the_one_crawl_there(
    project: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Seen in a user trial: a project with two spiders, one of them crawled: ``status``
    asked "which crawl?" while the only crawl of the project's spiders was listed."""
    redis7_client.flushall()
    (project / "rcproj" / "spiders" / "two.py").write_text(
        PROJECT_SPIDER.replace("One", "Two").replace('"only"', '"other"')
    )
    code, out = invoke("seed", "https://a.example/", "--redis-url", redis7.url, "--crawl", "only")
    assert code == 0, out
    code, out = invoke("status", "--redis-url", redis7.url)
    assert code == 0 and "crawl only" in out, out
    # a crawl of no spider of this project is not picked
    code, out = invoke("purge", "--redis-url", redis7.url, "--crawl", "only", "--yes")
    assert code == 0, out
    code, out = invoke(
        "seed", "https://a.example/", "--redis-url", redis7.url, "--crawl", "elsewhere"
    )
    assert code == 0, out
    code, out = invoke("status", "--redis-url", redis7.url)
    assert code == 2 and "which crawl?" in out, out
