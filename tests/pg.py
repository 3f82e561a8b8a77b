"""A real, throwaway PostgreSQL server for tests.

Uses Debian's server binaries (``apt-get install postgresql``, which puts ``initdb`` and
``pg_ctl`` under ``/usr/lib/postgresql/<version>/bin`` and creates the ``postgres`` system
user). PostgreSQL refuses to run as root, so when the tests run as root the server is run
as ``postgres`` through ``runuser``; its data directory is a fresh temporary directory
owned by that user. The server listens on 127.0.0.1 only, on a free port, without Unix
sockets, with trust authentication and fsync off (speed; the data is thrown away), and is
stopped with ``pg_ctl stop -m immediate``.

Missing binaries are a skip locally and a failure when ``CI=true``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .conftest import need

DATABASE = "redcrawl_test"


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding initdb and pg_ctl."""
    found: list[tuple[int, Path]] = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        bindir = Path(initdb).parent
        if os.access(initdb, os.X_OK) and os.access(bindir / "pg_ctl", os.X_OK):
            version = bindir.parent.name
            found.append((int(version) if version.isdigit() else 0, bindir))
    return max(found)[1] if found else None


def require_bindir() -> Path:
    """The binaries' folder; skips the test (fails it in CI) when PostgreSQL is missing."""
    bindir = find_bindir()
    if bindir is None:
        need(
            "PostgreSQL",
            "no server binaries in /usr/lib/postgresql/*/bin; apt-get install postgresql",
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            need(
                "PostgreSQL's 'postgres' system user",
                "running as root needs it; apt-get install postgresql creates it",
            )
    return bindir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One running server; :attr:`dsn` points at an empty database on it."""

    def __init__(self, bindir: Path, *, start_timeout: float = 30.0) -> None:
        self.bindir = bindir
        self.as_root = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="redcrawl-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self.dsn = ""
        try:
            if self.as_root:
                pw = pwd.getpwnam("postgres")
                os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            )
            self._start(start_timeout)
            self._run(
                "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", DATABASE
            )
        except BaseException:
            self.stop()
            raise
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _cmd(self, program: str, *args: str) -> list[str]:
        cmd = [str(self.bindir / program), *args]
        return ["runuser", "-u", "postgres", "--", *cmd] if self.as_root else cmd

    def _run(
        self, program: str, *args: str, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            self._cmd(program, *args),
            cwd=self.root,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
                f"{self._log_tail()}"
            )
        return result

    def _log_tail(self) -> str:
        try:
            return "\nserver log:\n" + self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _start(self, timeout: float) -> None:
        # The free port can be taken between choosing and binding it: try a few.
        for attempt in range(3):
            self.port = _free_port()
            options = (
                f"-F -c fsync=off -c listen_addresses=127.0.0.1 -p {self.port} "
                "-c unix_socket_directories='' -c max_connections=50"
            )
            result = self._run(
                "pg_ctl",
                "start",
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                str(int(timeout)),
                "-o",
                options,
                check=False,
                timeout=timeout + 10,
            )
            if result.returncode == 0:
                return
            if attempt == 2 or "could not bind" not in self._log_tail():
                raise RuntimeError(
                    f"pg_ctl start failed:\n{result.stdout}{result.stderr}{self._log_tail()}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a throwaway server (or skip / fail, see :func:`require_bindir`), then stop it."""
    server = PostgresServer(require_bindir())
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def postgres_dsn() -> Iterator[str]:
    """Like :func:`postgres_server`, yielding just the DSN of its empty database."""
    with postgres_server() as server:
        yield server.dsn
