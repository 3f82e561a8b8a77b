"""``redcrawl crawl``'s worker processes (:mod:`redcrawl.workers`): output always drained
to per-worker logs, signals forwarded (a second one kills), crashed workers restarted.

The crawl tests run the real command (``python -m redcrawl.cli crawl``) with real Scrapy
workers against the local shop site and a real Redis; the supervisor tests run small
Python programs as "workers" so they need no Scrapy and take a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.demo.run import SPIDER, demo_worker_settings
from redcrawl.demo.site import ShopSite, SiteConfig
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import open_frontier
from redcrawl.scrapy.feed_storage import FEED_STORAGES_BASE
from redcrawl.scrapy.pipelines import read_items
from redcrawl.settings import Settings
from redcrawl.workers import ExitCode, Fleet, WorkerEvent, _Watch, worker_command

from .conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def processes_with(*texts: str) -> list[int]:
    """Pids of the live processes whose command line contains each of ``texts``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if all(t in cmdline for t in texts) and state != "Z":
            found.append(int(entry.name))
    return found


def kill_all(text: str) -> None:
    for pid in processes_with(text):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def cli_env(redis_url: str) -> dict[str, str]:
    """Our environment without REDCRAWL_*/Scrapy variables, this checkout on the path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REDCRAWL_", "SCRAPY_")) and k != "PYTHONPATH"
    }
    env.update(PYTHONPATH=str(ROOT / "src"), REDCRAWL_REDIS_URL=redis_url, COLUMNS="120")
    return env


def crawl_cmd(
    site: ShopSite, crawl: str, items_db: Path, *extra: str, workers: int = 1
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "redcrawl.cli",
        "crawl",
        str(SPIDER),
        "--workers",
        str(workers),
        "--crawl",
        crawl,
        "--arg",
        f"url={site.url}",
    ]
    for item in demo_worker_settings(items_db):
        cmd += ["--set", item]
    return [*cmd, *extra]


@pytest.fixture
def shop_site(request: pytest.FixtureRequest) -> Iterator[ShopSite]:
    config: SiteConfig = getattr(request, "param", SiteConfig(products=300))
    with ShopSite(config) as site:
        yield site
        kill_all(site.url)  # whatever a failed test left running


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_crawl_at_debug_log_level_fetches_every_page(
    redis7: RedisServer, tmp_path: Path, shop_site: ShopSite
) -> None:
    """Scrapy's default LOG_LEVEL (DEBUG) writes a line per request and item: a worker
    whose output nobody reads blocks once the pipe is full (it stopped at 32 of 311
    pages). Every page is fetched, and the worker's log (with Scrapy's closing stats) is
    in the crawl's folder."""
    redis.Redis.from_url(redis7.url).flushall()
    items_db = tmp_path / "items.db"
    cmd = crawl_cmd(shop_site, "debug", items_db, "--set", "LOG_LEVEL=DEBUG")
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=cli_env(redis7.url), stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            code = proc.wait(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"redcrawl crawl hung at DEBUG: {len(shop_site.hits())} pages fetched"
            ) from None
    text = out.read_text(errors="replace")
    assert code == 0, text[-3000:]
    expected = shop_site.canonical_pages()
    assert expected <= set(shop_site.hits()), len(expected - set(shop_site.hits()))
    log = tmp_path / ".redcrawl" / "logs" / "debug" / "w0.log"
    assert str(log.relative_to(tmp_path)) in text  # said where the logs are
    written = log.read_text(errors="replace")
    assert " DEBUG: Crawled (200)" in written and "Dumping Scrapy stats" in written


def wait_until(
    predicate: Callable[[], bool], proc: subprocess.Popen[bytes], out: Path, timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, out.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)


SLOW_SHOP = SiteConfig(products=500, slow_every=2, slow_delay=0.05)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("shop_site", [SLOW_SHOP], indirect=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_stop_signal_stops_workers_cleanly_and_rerun_finishes(
    redis7: RedisServer, tmp_path: Path, shop_site: ShopSite, signum: int
) -> None:
    """SIGTERM (from `timeout`, systemd, docker stop) or SIGHUP to `redcrawl crawl` stops
    its workers as Ctrl-C does: none is left running, no lease is left held, and the
    same command run again fetches exactly the rest."""
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    frontier = open_frontier(client, Settings(), "stop")
    items_db = tmp_path / "items.db"
    cmd = crawl_cmd(
        shop_site, "stop", items_db, "--set", "CONCURRENT_REQUESTS=4", "--no-progress", workers=2
    )
    out = tmp_path / "first.txt"
    with out.open("wb") as sink:
        first = subprocess.Popen(
            cmd, cwd=tmp_path, env=cli_env(redis7.url), stdout=sink, stderr=subprocess.STDOUT
        )
        wait_until(lambda: frontier.counts().done >= 100, first, out)
        assert len(processes_with("-m scrapy ", shop_site.url)) == 2
        first.send_signal(signum)
        assert first.wait(timeout=60) == 128 + signum, out.read_text()[-3000:]
    assert processes_with(shop_site.url) == [], "workers left running"
    mid = frontier.counts()
    assert not mid.finished and mid.in_flight == 0 and mid.conserved, mid
    assert "run the same command again" in out.read_text()

    second = subprocess.run(
        cmd, cwd=tmp_path, env=cli_env(redis7.url), capture_output=True, timeout=150
    )
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    hits = shop_site.hits()
    assert set(hits) == shop_site.canonical_pages()
    twice = {path: n for path, n in hits.items() if n > 1}
    assert not twice, f"fetched more than once: {list(twice.items())[:10]}"
    assert frontier.counts().finished and len(read_items(f"sqlite:///{items_db}")) == 500


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("shop_site", [SLOW_SHOP], indirect=True)
def test_killed_worker_is_restarted_and_crawl_finishes(
    redis7: RedisServer, tmp_path: Path, shop_site: ShopSite
) -> None:
    """A worker SIGKILLed from outside is restarted (and said so); what it held is given
    back at once; the crawl finishes with every page and exit 0."""
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    frontier = open_frontier(client, Settings(), "restart")
    items_db = tmp_path / "items.db"
    cmd = crawl_cmd(
        shop_site, "restart", items_db, "--set", "CONCURRENT_REQUESTS=4", "--no-progress", workers=2
    )
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=cli_env(redis7.url), stdout=sink, stderr=subprocess.STDOUT
        )
        wait_until(lambda: frontier.counts().done >= 100, proc, out)
        victims = processes_with("-m scrapy ", shop_site.url)
        assert len(victims) == 2
        os.kill(victims[0], signal.SIGKILL)
        code = proc.wait(timeout=180)
    text = out.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "was killed by SIGKILL; restarting it" in text, text[-3000:]
    assert processes_with(shop_site.url) == []
    c = frontier.counts()
    assert c.finished and c.conserved and c.dead == 0, c
    assert shop_site.canonical_pages() <= set(shop_site.hits())
    assert len(read_items(f"sqlite:///{items_db}")) == 500
    logs = sorted((tmp_path / ".redcrawl" / "logs" / "restart").glob("w*.log"))
    assert len(logs) == 2
    assert sum(log.read_text().count("--- redcrawl: worker") for log in logs) == 3


# --- the supervisor alone, with small Python programs as workers -----------------------


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_worker_output_is_drained_to_its_log(tmp_path: Path) -> None:
    """Far more output than a pipe holds, on both streams: the worker finishes and its
    log has all of it."""
    code = (
        "import sys\nfor i in range(20000):\n"
        "    print('out', i)\n    print('err', i, file=sys.stderr)\n"
    )
    result = Fleet(python(code), workers=2, log_dir=tmp_path / "logs").run()
    assert result.returncodes == [0, 0] and result.code == ExitCode.OK
    for log in result.logs:
        text = log.read_text()
        assert "out 19999" in text and "err 19999" in text


def test_crashing_worker_is_restarted_with_backoff_then_given_up(tmp_path: Path) -> None:
    events: list[WorkerEvent] = []
    crashed: list[str] = []
    fleet = Fleet(
        python("import sys; print('boom'); sys.exit(3)"),
        workers=1,
        log_dir=tmp_path,
        max_restarts=2,
        backoff=0.01,
        on_event=events.append,
        on_crash=crashed.append,
        worker_id_prefix="host:c:",
    )
    result = fleet.run()
    assert result.returncodes == [3] and result.restarts == 2 and result.code == 1
    assert [e.kind for e in events] == ["restarting", "restarting", "failed"]
    assert "restarting it in 0.01 s (restart 1 of at most 2)" in events[0].message
    assert "restarting it in 0.02 s (restart 2 of at most 2)" in events[1].message
    assert events[-1].message == "worker w0 exited with status 3 after its restarts"
    assert "boom" in events[-1].log_tail
    assert crashed == ["host:c:w0"] * 3
    assert (tmp_path / "w0.log").read_text().count("--- redcrawl: worker w0") == 3


def test_no_restart_once_the_crawl_is_finished(tmp_path: Path) -> None:
    events: list[WorkerEvent] = []
    result = Fleet(
        python("raise SystemExit(1)"),
        workers=1,
        log_dir=tmp_path,
        backoff=0.01,
        unfinished=lambda: False,
        on_event=events.append,
    ).run()
    assert result.restarts == 0 and result.returncodes == [1]
    assert [e.kind for e in events] == ["failed"]


def test_a_crashed_worker_is_restarted_while_the_others_run_in_a_finished_crawl(
    tmp_path: Path,
) -> None:
    """A fleet of RedisSpiders waiting for start URLs (``MAX_IDLE_TIME_BEFORE_CLOSE`` 0)
    has a finished crawl for as long as the lull lasts: a worker killed then (the OOM
    killer, an operator) was not restarted, and the fleet was one worker short for good.
    While another worker runs, the crawl is not over: it is restarted."""
    events: list[WorkerEvent] = []
    marker = tmp_path / "crashed"
    code = (
        "import os, sys, time\n"
        "w0 = os.environ['REDCRAWL_WORKER_ID'].endswith('w0')\n"
        f"if w0 and not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close(); sys.exit(1)\n"
        f"while not os.path.exists({str(marker)!r}):\n"
        "    time.sleep(0.01)\n"
        "time.sleep(2.0)\n"  # (w1 runs on after w0's crash: w0's restart is due in 0.01 s)
    )
    result = Fleet(
        python(code),
        workers=2,
        log_dir=tmp_path,
        backoff=0.01,
        unfinished=lambda: False,
        on_event=events.append,
    ).run()
    assert [e.kind for e in events] == ["restarting"], [e.message for e in events]
    assert result.restarts == 1 and result.returncodes == [0, 0] and result.code == 0


def test_a_restart_due_after_the_crawl_finished_meanwhile_is_dropped(tmp_path: Path) -> None:
    """w0 crashes while w1 runs: its restart is due in 4 s. w1 finishes the crawl and
    exits before that: w0 is not started into a finished crawl (with SCHEDULER_PERSIST
    = False, one whose state the last worker removed: it would crawl it all again)."""
    events: list[WorkerEvent] = []
    marker = tmp_path / "crashed"
    code = (
        "import os, sys, time\n"
        "if os.environ['REDCRAWL_WORKER_ID'].endswith('w0'):\n"
        f"    open({str(marker)!r}, 'w').close(); sys.exit(1)\n"
        f"while not os.path.exists({str(marker)!r}):\n"
        "    time.sleep(0.01)\n"
        "time.sleep(1.5)\n"  # (running when w0's exit is read; gone before its restart)
    )
    result = Fleet(
        python(code),
        workers=2,
        log_dir=tmp_path,
        backoff=4.0,
        unfinished=lambda: False,
        on_event=events.append,
    ).run()
    assert [e.kind for e in events] == ["restarting", "exited"], [e.message for e in events]
    assert events[-1].message == "worker w0 not restarted: the crawl finished meanwhile"
    assert result.restarts == 1 and result.returncodes == [0, 0] and result.code == 0
    assert (tmp_path / "w0.log").read_text().count("--- redcrawl: worker w0") == 1


def test_a_crawl_nothing_was_pushed_to_yet_is_not_finished(redis7: RedisServer) -> None:
    """Found by SIGKILLing a worker of ``redcrawl crawl`` 6 s in, while Scrapy was still
    starting: nothing pushed yet reads as "nothing pending", i.e. finished, so the worker
    was not restarted and the command exited 1 though the crawl finished."""
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    frontier = open_frontier(client, Settings(), "fresh")
    watch = _Watch(frontier, 60.0, None)
    assert watch.unfinished()
    (env,) = [Envelope(url="http://a.test/", fingerprint=fingerprint("http://a.test/"))]
    frontier.push([env])
    assert watch.unfinished()
    frontier.ack(frontier.lease("w", 10))
    assert not watch.unfinished()
    # the last worker of a SCHEDULER_PERSIST = False crawl removed its state: finished
    frontier.purge()
    assert frontier.counts().accepted == 0
    assert not watch.unfinished()


def test_the_commands_outage_warning_does_not_tell_to_restart_the_worker() -> None:
    """Trial 7: the command's outage warning carried the workers' advice ("restart the
    worker when Redis is back") into a line that then says the workers go on by
    themselves."""
    server = RedisServer()
    frontier = open_frontier(redis.Redis.from_url(server.url), Settings(), "down")
    events: list[WorkerEvent] = []
    watch = _Watch(frontier, 60.0, events.append)
    server.stop()
    assert watch.read() is None
    (warning,) = [e.message for e in events]
    assert "Redis unreachable" in warning and "workers go on" in warning, warning
    assert "restart the worker" not in warning, warning


READY = "import signal, sys, time\n"
"""Workers below print 'ready' once their SIGINT handler is set."""


def _signal_self(fleet_logs: Path, signals: list[int]) -> Callable[[], None]:
    """A tick callback that sends this process the next of ``signals`` once every
    worker has said it is ready (the supervisor's handlers are installed by then)."""
    sent: list[int] = []

    def tick() -> None:
        logs = list(fleet_logs.glob("w*.log"))
        ready = logs and all("\nready\n" in p.read_text() for p in logs)
        if ready and len(sent) < len(signals):
            sent.append(signals[len(sent)])
            os.kill(os.getpid(), sent[-1])

    return tick


def test_first_signal_is_forwarded_as_sigint(tmp_path: Path) -> None:
    code = (
        READY + "signal.signal(signal.SIGINT, lambda *a: sys.exit(0))\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    fleet = Fleet(
        python(code),
        workers=2,
        log_dir=tmp_path,
        tick_interval=0.05,
        tick=_signal_self(tmp_path, [signal.SIGTERM]),
    )
    result = fleet.run()
    assert result.signal == signal.SIGTERM and result.code == 143
    assert result.returncodes == [0, 0]


def test_second_signal_kills_the_workers(tmp_path: Path) -> None:
    code = (
        READY + "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    events: list[WorkerEvent] = []
    fleet = Fleet(
        python(code),
        workers=2,
        log_dir=tmp_path,
        tick_interval=0.05,
        on_event=events.append,
        tick=_signal_self(tmp_path, [signal.SIGHUP, signal.SIGHUP]),
    )
    result = fleet.run()
    assert result.code == 128 + signal.SIGHUP
    assert result.returncodes == [-signal.SIGKILL] * 2
    assert [e.kind for e in events][:2] == ["stopping", "killing"]


def test_one_command_builder() -> None:
    cmd = worker_command(
        "spiders/x.py", settings={"LOG_LEVEL": "INFO"}, spider_args=["url=http://a"]
    )
    assert cmd[1:5] == ["-m", "scrapy", "runspider", "spiders/x.py"]
    assert cmd[5:] == [
        "-s",
        "SCHEDULER=redcrawl.scrapy.Scheduler",
        "-s",
        "DUPEFILTER_CLASS=redcrawl.scrapy.DupeFilter",
        "-s",
        "LOG_LEVEL=INFO",
        "-s",
        f"FEED_STORAGES_BASE={json.dumps(FEED_STORAGES_BASE)}",
        "-a",
        "url=http://a",
    ]
    plain = worker_command("myspider", redcrawl=False, python_args=["-X", "dev"])
    assert plain[1:] == ["-X", "dev", "-m", "scrapy", "crawl", "myspider"]


def test_without_a_log_folder_workers_write_to_our_terminal(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """``redcrawl crawl --logs -``: the workers inherit this process's stdout; their
    stderr is a pipe whose every byte a thread copies to this process's stderr (keeping
    its start and end to read the run from)."""
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    result = Fleet(python(code), workers=1).run()
    assert result.code == 0 and result.logs == []
    out, err = capfd.readouterr()
    assert "to stdout" in out and "to stderr" in err
