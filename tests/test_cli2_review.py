"""Review of the ``redcrawl crawl`` supervisor: what is restarted after an error at
import, a worker's child holding its stderr, worker ids unique per supervisor, the
failure folder. Real subprocesses, a real Redis; no mocks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from redcrawl.failure_file import FAILURE_FILE_ENV
from redcrawl.workers import Fleet, WorkerEvent, parse_run, worker_id_prefix

from .conftest import RedisServer
from .test_cli2_supervisor import run_crawl
from .test_workers import python

REFUSED_AT_IMPORT = """
import scrapy

# a service the spider connects to as it is imported, not up yet
raise ConnectionRefusedError(111, "Connection refused")


class Early(scrapy.Spider):
    name = "early"
"""

MISSING_AT_IMPORT = """
import scrapy

import nosuch_helpers_q


class Missing(scrapy.Spider):
    name = "missing"
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_transient_error_at_import_is_restarted(redis7: RedisServer, tmp_path: Path) -> None:
    """A ConnectionRefusedError raised as the spider module imports may be gone on the
    next run (a service not up yet): restarted as any crash is, each time saying it."""
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "early.py"
    spider.write_text(REFUSED_AT_IMPORT)
    code, out = run_crawl(redis7.url, tmp_path, spider, "--logs", "-")
    assert code == 1, out[-3000:]
    said = "at start (ConnectionRefusedError: [Errno 111] Connection refused)"
    assert out.count(f"{said}; restarting it in") == 2, out[-3000:]  # --max-restarts 2
    assert f"{said} after its restarts" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_missing_module_at_import_is_not_restarted(redis7: RedisServer, tmp_path: Path) -> None:
    """(``scrapy runspider`` says it as its usage error, exit 2: not restarted either.)"""
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "missing.py"
    spider.write_text(MISSING_AT_IMPORT)
    code, out = run_crawl(redis7.url, tmp_path, spider)
    assert code == 1, out[-3000:]
    assert "restarting" not in out and "not restarted" in out, out[-3000:]
    assert "No module named 'nosuch_helpers_q'" in out, out[-3000:]


def test_an_import_error_after_the_spider_opened_is_restarted() -> None:
    """An ImportError raised in a callback (a lazy import) once the spider is open: not a
    failure at start, the worker is restarted."""
    code = (
        "import sys\n"
        "print('2026-12-02 [scrapy.core.engine] INFO: Spider opened', file=sys.stderr)\n"
        "def parse():\n"
        "    import nosuch_lazy_q\n"
        "parse()\n"
    )
    events: list[WorkerEvent] = []
    result = Fleet(
        python(code), workers=1, max_restarts=1, backoff=0.01, on_event=events.append
    ).run()
    assert result.restarts == 1, [e.message for e in events]
    assert [e.kind for e in events] == ["restarting", "failed"], [e.message for e in events]
    tb = (
        "Traceback (most recent call last):\n"
        '  File "<frozen importlib._bootstrap>", line 1, in _find_and_load\n'
        '  File "/p/spider.py", line 1, in <module>\n'
        "ImportError: cannot import name 'x'\n"
    )
    run = parse_run(tb)
    assert run.fatal == "ImportError: cannot import name 'x'"
    opened = parse_run("2026-12-02 [scrapy.core.engine] INFO: Spider opened\n" + tb)
    assert opened.fatal is None and opened.import_failure is None
    keyerror = parse_run(tb.replace("ImportError: cannot import name 'x'", "KeyError: 'K'"))
    assert keyerror.fatal is None and keyerror.import_failure == "KeyError: 'K'"


def test_an_exit_is_reported_while_a_child_of_the_worker_holds_its_stderr(
    tmp_path: Path,
) -> None:
    """w0 leaves a child holding its stderr until w1 has exited (``--logs -``): w0's exit
    is reported at once, before w1's exit, not once its child lets the pipe go."""
    mark = tmp_path / "w1-exited"
    code = (
        "import os, subprocess, sys, time\n"
        "if os.environ['REDCRAWL_WORKER_ID'].endswith('w0'):\n"
        f"    subprocess.Popen(['sh', '-c', 'while [ ! -e {mark} ]; do sleep 0.05; done'])\n"
        "    sys.exit(1)\n"
        "time.sleep(8)\n"  # (a margin for a loaded machine: the 0.3 s read is the fix)
        f"open({str(mark)!r}, 'w').close()\n"
        "sys.exit(1)\n"
    )
    seen: list[tuple[str, bool]] = []
    events: list[WorkerEvent] = []

    def on_event(event: WorkerEvent) -> None:
        events.append(event)
        seen.append((event.worker, mark.exists()))

    try:
        Fleet(python(code), workers=2, max_restarts=0, on_event=on_event).run()
    finally:
        mark.touch()
    assert [w for w, _ in seen] == ["w0", "w1"], [e.message for e in events]
    assert seen[0] == ("w0", False), "w0's exit was reported only after w1 had exited"


def test_worker_ids_are_unique_per_supervisor() -> None:
    """Two supervisors of one crawl with the same hostname and pid (containers with
    --network host, each supervisor pid 1) must not share worker ids: a supervisor gives
    back what its gone workers hold, by id."""
    a, b = worker_id_prefix("c"), worker_id_prefix("c")
    assert a != b
    assert a.startswith(f"{os.uname().nodename}:c:{os.getpid()}:") and a.endswith(":")


def test_the_failure_folder_is_made_again_if_it_is_removed(tmp_path: Path) -> None:
    """A tmp cleaner removing the failure folder while the fleet runs: the next run still
    reports its failure reason."""
    count = tmp_path / "runs"
    code = (
        "import os, shutil, sys\n"
        f"runs = {str(count)!r}\n"
        "n = int(open(runs).read()) if os.path.exists(runs) else 0\n"
        "open(runs, 'w').write(str(n + 1))\n"
        f"path = os.environ[{FAILURE_FILE_ENV!r}]\n"
        "if n == 0:\n"
        "    shutil.rmtree(os.path.dirname(path))\n"
        "    sys.exit(1)\n"
        "open(path, 'w').write('layout_mismatch')\n"
        "sys.exit(1)\n"
    )
    events: list[WorkerEvent] = []
    Fleet(python(code), workers=1, max_restarts=2, backoff=0.01, on_event=events.append).run()
    assert [e.kind for e in events] == ["restarting", "failed"], [e.message for e in events]
    assert events[-1].failure == "layout_mismatch"
