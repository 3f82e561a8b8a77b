"""What the SIGKILL tests share: reading a frontier worker's log, and killing a worker at
a moment it holds leases (frozen first, so what is seen held is what it holds)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from redcrawl.frontier import FrontierCore, InflightInfo

__all__ = [
    "kill_one_midway",
    "kill_while_holding",
    "parse_log",
    "running_workers",
    "start_workers",
    "work_seconds",
]

ROOT = Path(__file__).resolve().parent.parent


def work_seconds(logfile: str) -> float:
    """How long the worker logging to ``logfile`` "processes" a batch while it holds its
    leases: 0.02 s, or 0.25 s once :func:`kill_while_holding` hunts it (a file beside its
    log says so), so that it holds leases nearly all the time and cannot run through its
    share before it is caught. (A fast victim, under a loaded CI, was once not seen
    holding anything before the others had finished the crawl, and exited; a victim slow
    from the start slows the whole crawl: it holds a site's fleet-wide slots.)"""
    return 0.25 if os.path.exists(logfile + ".hunted") else 0.02


def start_workers(
    redis_url: str, crawl: str, logs: list[Path], backend: str, *extra: str
) -> list[subprocess.Popen[bytes]]:
    """One ``tests/frontier_worker.py`` process per log file (named w0, w1, ...), on this
    checkout's redcrawl; ``extra`` is passed on (a key that says the producer is done)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    cmd = [sys.executable, "-m", "tests.frontier_worker", redis_url, crawl]
    return [
        subprocess.Popen(
            [*cmd, f"w{i}", str(log), backend, *extra],
            cwd=ROOT,
            env=env,
        )
        for i, log in enumerate(logs)
    ]


@contextmanager
def running_workers(
    redis_url: str, crawl: str, logs: list[Path], backend: str, *extra: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``start_workers``, and any still running at the end are SIGKILLed: a failed test
    leaves no worker behind to fail a later test on the same pytest-xdist worker."""
    procs = start_workers(redis_url, crawl, logs, backend, *extra)
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def parse_log(log: Path) -> tuple[list[list[tuple[str, str]]], list[int]]:
    """Batches of (id, token) processed, and the acked count of each batch that got one."""
    batches: list[list[tuple[str, str]]] = []
    acked: list[int] = []
    current: list[tuple[str, str]] = []
    for line in log.read_text().splitlines():
        kind, a, b = line.split()
        if kind == "P":
            current.append((a, b))
        else:
            batches.append(current)
            acked.append(int(a))
            assert int(b) == len(current)
            current = []
    if current:
        batches.append(current)  # processed, never acked: the kill came in between
    return batches, acked


def kill_while_holding(
    proc: subprocess.Popen[bytes],
    worker: str,
    frontier: FrontierCore,
    deadline: float,
    log: Path | None = None,
) -> list[InflightInfo]:
    """SIGKILL ``proc`` at a moment it holds leases, and return them. It runs freely until
    it is seen holding some, then is frozen (SIGSTOP) and a command it had already sent is
    given time to finish, so what is seen held is what it holds when killed; if it holds
    nothing by then, it runs on and the next moment is tried. (Freezing it on a timer
    instead starved it under a loaded CI: the others finished the crawl while it was
    frozen, and it exited without ever being seen holding a lease.)"""

    def holding() -> list[InflightInfo]:
        return [x for x in frontier.inflight(limit=10_000) if x.worker == worker]

    if log is not None:  # from now on it is slow (work_seconds)
        Path(f"{log}.hunted").touch()

    while True:
        assert time.monotonic() < deadline, f"{worker} never held a lease"
        assert proc.poll() is None, (
            f"{worker} exited ({proc.returncode}) before it was seen holding a lease"
        )
        if not holding():
            time.sleep(0.002)
            continue
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        held = holding()
        if held:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return held
        proc.send_signal(signal.SIGCONT)


def kill_one_midway(
    redis_url: str, crawl: str, logs: list[Path], backend: str, frontier: FrontierCore, n: int
) -> list[InflightInfo]:
    """Run one worker per log; once a third of the crawl's ``n`` requests are done,
    SIGKILL w1 while it holds leases (:func:`kill_while_holding`) and let the others
    finish (each exits 0). Returns what w1 held."""
    with running_workers(redis_url, crawl, logs, backend) as procs:
        victim = procs[1]
        deadline = time.monotonic() + 60
        while frontier.counts().done < n // 3:
            assert time.monotonic() < deadline, "workers made no progress"
            time.sleep(0.01)
        held = kill_while_holding(victim, "w1", frontier, deadline, logs[1])
        for p in procs:
            if p is not victim:
                assert p.wait(timeout=120) == 0
    return held
