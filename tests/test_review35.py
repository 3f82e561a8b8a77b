"""Review 35: defects found in the commits d4436b1..a971a48 (retries spaced for the fleet,
robots.txt pushing back, stop signals around the main command), each shown by a test that
fails on the code it was written against. Real redis-server, real Scrapy workers."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from redcrawl.embedded import EmbeddedRedis

from .test_trial12_messy_sites import ROOT

STOPS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def _blocked(pid: int) -> set[int]:
    """The signals blocked in process ``pid`` (its SigBlk mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no SigBlk for {pid}")


def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_the_embedded_redis_server_takes_sigterm(tmp_path: Path) -> None:
    """``EmbeddedRedis.start`` blocks SIGINT/SIGTERM/SIGHUP (``pthread_sigmask``) while it
    spawns the server and claims it (417f426), but a signal mask is inherited through
    fork and exec: the redis-server it starts has the three blocked for its whole life.
    ``kill PID`` (what redcrawl's own message advises: "Stop it (`kill {pid}`: it saves
    its data first)"), systemd's or Docker's stop, and the deleted-folder path of
    ``EmbeddedRedis.stop`` (``proc.terminate()``, then 10 s, then SIGKILL) never reach
    it: it runs on until SIGKILL, which skips its AOF flush."""
    server = EmbeddedRedis(tmp_path / ".redcrawl")
    server.start()
    proc = server.proc
    assert proc is not None
    try:
        blocked = _blocked(proc.pid) & set(STOPS)
        os.kill(proc.pid, signal.SIGTERM)
        gone = _exited(proc, 5.0)
        assert gone and not blocked, (
            f"redis-server pid {proc.pid} still runs 5 s after SIGTERM "
            f"(blocked in it: {sorted(signal.Signals(s).name for s in blocked)})"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


def test_a_start_waiting_for_the_folders_lock_still_takes_a_stop_signal(tmp_path: Path) -> None:
    """``EmbeddedRedis.start`` now blocks SIGINT/SIGTERM/SIGHUP for its whole ``with
    self._locked()`` block, and ``_locked`` waits for ``start.lock`` with a plain
    ``flock`` (no timeout). A process that holds that lock and does not let go (another
    redcrawl process stopped with Ctrl-Z, or hung, in the middle of its start or stop)
    leaves ``redcrawl crawl`` waiting with its stop signals blocked: Ctrl-C, SIGTERM and
    SIGHUP do nothing, only SIGKILL ends it (Trial 14's "never hangs"). Before 417f426 the
    signal ended the wait."""
    folder = tmp_path / ".redcrawl"
    folder.mkdir(mode=0o700)
    script = (
        "import sys; from pathlib import Path; from redcrawl.embedded import EmbeddedRedis; "
        "print('starting', flush=True); EmbeddedRedis(Path(sys.argv[1])).start()"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with open(folder / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (held by "another process")
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(folder)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"starting\n"
            time.sleep(1.0)  # (it waits in flock now)
            proc.send_signal(signal.SIGTERM)
            stopped = _exited(proc, 5.0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    assert stopped, "SIGTERM did not end a start waiting for the folder's lock within 5 s"
