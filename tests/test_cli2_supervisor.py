"""Day one of ``redcrawl crawl`` for a user coming from scrapy-redis: a worker that fails
the same way every time is recognised in both log modes (``--logs -`` too) and at import
time, and a crawl whose workers were all stopped from outside does not exit 0.

Real ``redcrawl crawl`` runs, real Scrapy workers, a real Redis; no mocks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.demo.site import ShopSite, SiteConfig
from redcrawl.failure_file import FAILURE_FILE_ENV
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings
from redcrawl.workers import Fleet, WorkerEvent, parse_run

from .conftest import RedisServer
from .test_trial_cli_workers import PRIVATE
from .test_workers import (
    SLOW_SHOP,
    cli_env,
    crawl_cmd,
    kill_all,
    processes_with,
    python,
    wait_until,
)


@pytest.fixture
def shop_site(request: pytest.FixtureRequest) -> Iterator[ShopSite]:
    config: SiteConfig = getattr(request, "param", SiteConfig(products=300))
    with ShopSite(config) as site:
        yield site
        kill_all(site.url)  # whatever a failed test left running


def run_crawl(
    redis_url: str, cwd: Path, spider: Path, *extra: str, timeout: float = 150
) -> tuple[int, str]:
    """``redcrawl crawl SPIDER -w 1`` (at most 2 restarts), on crawl ``c`` unless
    ``--crawl`` is given; crawl ``c`` has a request waiting, so that a failed worker
    would be restarted (a finished crawl restarts none)."""
    seeded = CliRunner().invoke(
        app, ["seed", "http://127.0.0.1:9/waiting", "--redis-url", redis_url, "--crawl", "c"]
    )
    assert seeded.exit_code == 0, seeded.output
    crawl = [] if "--crawl" in extra else ["--crawl", "c"]
    cmd = [
        sys.executable, "-m", "redcrawl.cli", "crawl", str(spider), "-w", "1",
        "--no-progress", "--max-restarts", "2", *crawl, *extra,
    ]  # fmt: skip
    env = {**cli_env(redis_url), "COLUMNS": "400"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, timeout=timeout)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


# --- 1. the failure file: a deterministic failure is recognised with --logs - too -------


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_deterministic_failure_is_not_restarted_with_logs_to_the_terminal(
    redis7: RedisServer, tmp_path: Path, shop_site: ShopSite
) -> None:
    """`--logs -`: no log file to read; the refusing worker writes its reason to the
    file the supervisor gave it, and the supervisor reads that."""
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "private.py"
    spider.write_text(PRIVATE)
    code, out = run_crawl(
        redis7.url, tmp_path, spider, "--logs", "-", "--crawl", "private",
        "--arg", f"url={shop_site.url}",
    )  # fmt: skip
    assert code == 1, out[-3000:]
    assert "restarting" not in out, out[-3000:]
    assert "redcrawl failure 'unstorable_request', not restarted" in out, out[-3000:]


BAD_KEY = """
from redcrawl.scrapy import RedisSpider


class BadKey(RedisSpider):
    name = "badkey"
    redis_key = "start}urls"

    def parse(self, response):
        yield {"url": response.url}
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_spider_refused_before_the_crawl_starts_is_not_restarted_with_logs_to_the_terminal(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """A RedisSpider refused as it is built (its start key cannot be used): the crawler
    has no stats yet (Scrapy 2.19 raises on reading them), the reason is the refusal's."""
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "badkey.py"
    spider.write_text(BAD_KEY)
    code, out = run_crawl(redis7.url, tmp_path, spider, "--logs", "-")
    assert code == 1, out[-3000:]
    assert "restarting" not in out and "Traceback" not in out, out[-3000:]
    assert "redcrawl failure 'config_error', not restarted" in out, out[-3000:]


def test_the_failure_file_is_read_without_a_log(tmp_path: Path) -> None:
    """The supervisor's side of the protocol: each run gets a fresh path in its
    environment; what a worker writes there is its failure reason."""
    events: list[WorkerEvent] = []
    writes = python(
        f"import os\nopen(os.environ[{FAILURE_FILE_ENV!r}], 'w').write('layout_mismatch')\n"
        "raise SystemExit(1)\n"
    )
    result = Fleet(writes, workers=1, backoff=0.01, on_event=events.append).run()
    assert result.restarts == 0 and result.code == 1
    assert [e.kind for e in events] == ["failed"] and events[0].failure == "layout_mismatch"


# --- 2. every worker stopped from outside: not a success --------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("shop_site", [SLOW_SHOP], indirect=True)
def test_all_workers_sigtermed_from_outside_is_not_a_success(
    redis7: RedisServer, tmp_path: Path, shop_site: ShopSite
) -> None:
    """`pkill -TERM -f "scrapy crawl"` while the crawl is unfinished: each worker closes
    cleanly and exits 0; the command says the crawl is not finished and how to resume it,
    and exits non-zero."""
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    frontier = open_frontier(client, Settings(), "allterm")
    cmd = crawl_cmd(
        shop_site, "allterm", tmp_path / "items.db", "--set", "CONCURRENT_REQUESTS=4",
        "--no-progress", workers=2,
    )  # fmt: skip
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=cli_env(redis7.url), stdout=sink, stderr=subprocess.STDOUT
        )
        wait_until(lambda: frontier.counts().done >= 50, proc, out)
        victims = processes_with("-m scrapy ", shop_site.url)
        assert len(victims) == 2
        for pid in victims:
            os.kill(pid, signal.SIGTERM)
        code = proc.wait(timeout=120)
    text = out.read_text(errors="replace")
    c = frontier.counts()
    assert not c.finished and c.in_flight == 0 and c.conserved, c
    assert code == 5, text[-3000:]
    assert "crawl allterm is not finished" in text, text[-3000:]
    assert "run the same command again to resume" in text, text[-3000:]


# --- 3. a worker that fails at import -----------------------------------------------------

SYNTAX_ERROR = """
import scrapy


class Broken(scrapy.Spider):
    name = "broken"

    def parse(self, response)
        pass
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("logs", ["file", "-"])
def test_a_syntax_error_in_the_spider_is_not_restarted(
    redis7: RedisServer, tmp_path: Path, logs: str
) -> None:
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "broken.py"
    spider.write_text(SYNTAX_ERROR)
    extra = ["--logs", "-"] if logs == "-" else []
    code, out = run_crawl(redis7.url, tmp_path, spider, *extra)
    assert code == 1, out[-3000:]
    assert "restarting" not in out, out[-3000:]
    assert "failed at start (SyntaxError: expected ':'), not restarted" in out, out[-3000:]
    assert "broken.py" in out and "def parse(self, response)" in out, out[-3000:]


ENV_AT_IMPORT = """
import os

import scrapy

URL = os.environ["NOSUCH_SPIDER_URL_Q"]


class Env(scrapy.Spider):
    name = "env"
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_an_error_raised_while_the_spider_module_imports_is_restarted_and_said(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """Any other exception raised by a module's own code as it is imported (here a
    KeyError: an environment variable the spider reads at import is not set) may be
    transient: restarted as any crash is, each exit saying the exception and where."""
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "env.py"
    spider.write_text(ENV_AT_IMPORT)
    code, out = run_crawl(redis7.url, tmp_path, spider)
    assert code == 1, out[-3000:]
    said = "at start (KeyError: 'NOSUCH_SPIDER_URL_Q')"
    assert out.count(f"{said}; restarting it in") == 2, out[-3000:]  # --max-restarts 2
    assert f"{said} after its restarts" in out, out[-3000:]
    assert "env.py" in out and 'URL = os.environ["NOSUCH_SPIDER_URL_Q"]' in out, out[-3000:]


SPIDER = """
import scrapy


class Fine(scrapy.Spider):
    name = "fine"
    start_urls = ["http://127.0.0.1:9/"]
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_missing_module_in_the_project_is_not_restarted(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """A pipeline whose module does not exist: Scrapy fails building its engine (an
    asyncio 'Task exception was never retrieved' traceback), exit 1, every time."""
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "fine.py"
    spider.write_text(SPIDER)
    code, out = run_crawl(
        redis7.url, tmp_path, spider, "--set", 'ITEM_PIPELINES={"nosuch_pipes.Store": 300}'
    )
    assert code == 1, out[-3000:]
    assert "restarting" not in out, out[-3000:]
    assert (
        "failed at start (ModuleNotFoundError: No module named 'nosuch_pipes'), not restarted"
        in out
    ), out[-3000:]


def make_project(root: Path) -> dict[str, str]:
    """A Scrapy project in ``root`` with one spider, ``fine``; the environment to run
    the command in it."""
    (root / "scrapy.cfg").write_text("[settings]\ndefault = proj.settings\n")
    package = root / "proj"
    (package / "spiders").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    (package / "settings.py").write_text('SPIDER_MODULES = ["proj.spiders"]\n')
    (package / "spiders" / "fine.py").write_text(SPIDER)
    env = cli_env("redis://127.0.0.1:1/0")
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env['PYTHONPATH']}"
    return env


def redcrawl(cwd: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "redcrawl.cli", *args], cwd=cwd, env=env, capture_output=True,
        timeout=60,
    )  # fmt: skip
    return done.returncode, done.stderr.decode()


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("import nosuch_module_q\n", "ModuleNotFoundError: No module named 'nosuch_module_q'"),
        # the line is the spider's, not the one in os.py where KeyError was raised
        ("import os\n\nURL = os.environ['NOSUCH_VAR_Q']\n", "KeyError: 'NOSUCH_VAR_Q'"),
    ],
)
def test_a_broken_spider_module_in_a_project_is_said_before_any_worker(
    tmp_path: Path, source: str, said: str
) -> None:
    """`scrapy crawl NAME` loads every spider module of the project: the command does the
    same before it starts a worker, and says what is broken (no traceback of its own)."""
    env = make_project(tmp_path)
    (tmp_path / "proj" / "spiders" / "bad.py").write_text(source)
    code, err = redcrawl(tmp_path, env, "crawl", "fine", "--no-progress")
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "error: this Scrapy project cannot be loaded" in err, err[-3000:]
    line = source.count("\n")
    assert f"{said} (" in err and f"bad.py, line {line})" in err, err[-3000:]


@pytest.mark.parametrize("command", [["crawl", "fine", "--no-progress"], ["status"]])
def test_a_broken_project_settings_module_is_said_not_a_traceback(
    tmp_path: Path, command: list[str]
) -> None:
    env = make_project(tmp_path)
    with (tmp_path / "proj" / "settings.py").open("a") as f:
        f.write("import nosuch_settings_q\n")
    code, err = redcrawl(tmp_path, env, *command)
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "error: this Scrapy project cannot be loaded" in err, err[-3000:]
    assert "ModuleNotFoundError: No module named 'nosuch_settings_q'" in err, err[-3000:]
    assert "settings.py, line 2" in err, err[-3000:]


# --- a worker gone without giving its leases back -----------------------------------------

QUITTER = """
import os

import scrapy


class Quitter(scrapy.Spider):
    name = "quitter"

    def __init__(self, url="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]

    def parse(self, response):
        for href in response.css("a::attr(href)").getall()[:20]:
            yield response.follow(href, callback=self.quit)

    def quit(self, response):
        os._exit(0)  # as a worker SIGINTed while its spider opens: no close, exit 0
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_leases_of_a_worker_gone_with_status_0_are_given_back(
    redis7: RedisServer, tmp_path: Path, shop_site: ShopSite
) -> None:
    """Seen in a stop by SIGTERM: a worker SIGINTed just as its spider opened exited 0
    without closing it, its leases held until they expired (the rerun waited for them).
    Whatever the exit status, the command gives back what a gone worker of its own
    still holds."""
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    frontier = open_frontier(client, Settings(), "quitter")
    spider = tmp_path / "quitter.py"
    spider.write_text(QUITTER)
    code, out = run_crawl(
        redis7.url, tmp_path, spider, "--crawl", "quitter", "--arg", f"url={shop_site.url}"
    )
    c = frontier.counts()
    assert c.done >= 1 and not c.finished, (c, out[-3000:])
    assert c.in_flight == 0 and c.conserved, (c, out[-3000:])
    assert frontier.workers() == {}, out[-3000:]
    assert code == 5, out[-3000:]
    assert "worker w0 exited holding" in out and "given back now" in out, out[-3000:]


def test_only_the_last_traceback_and_only_import_failures_count() -> None:
    """A callback's error (Scrapy logs it and goes on) is not a failure at start; a
    chained traceback counts by its last exception."""
    callback = (
        "2026-12-02 [scrapy.core.scraper] ERROR: Spider error processing <GET http://x/>\n"
        "Traceback (most recent call last):\n"
        '  File "/p/spider.py", line 9, in parse\n'
        "    raise KeyError('price')\n"
        "KeyError: 'price'\n"
    )
    assert parse_run(callback).exception == "KeyError: 'price'"
    assert parse_run(callback).fatal is None
    chained = (
        "Traceback (most recent call last):\n"
        '  File "<frozen importlib._bootstrap>", line 241, in _call_with_frames_removed\n'
        '  File "/p/settings_helper.py", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'x'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/p/run.py", line 3, in main\n'
        "RuntimeError: gave up\n"
        "2026-12-02 [scrapy.core.engine] INFO: Spider closed (shutdown)\n"
    )
    run = parse_run(chained)
    assert run.exception == "RuntimeError: gave up" and run.fatal is None
    assert run.finish == "shutdown"
    imported = parse_run(chained.split("\n\nDuring")[0] + "\n")
    assert imported.fatal == "ModuleNotFoundError: No module named 'x'"
    assert imported.import_failure is None  # (fatal at once)
    assert imported.traceback == [
        '  File "/p/settings_helper.py", line 1, in <module>',
        "ModuleNotFoundError: No module named 'x'",
    ]
