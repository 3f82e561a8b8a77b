"""Durability on replicated Redis (a Redis Cluster, or one server with replicas): what a
failover can take back, and the two things the frontier does about it.

- :class:`ReplicaWait` (``REDCRAWL_WAIT_REPLICAS``, ``REDCRAWL_WAIT_TIMEOUT``): a worker's
  state-changing call (:data:`WAITED`) is followed by ``WAIT n timeout`` on the same
  connection, in the same round trip (a pipeline; pipelined settles send one WAIT when a
  result is asked for, covering every settle sent: ``frontier/settle.py``), so the call
  returns once ``n`` replicas have its writes. Fewer replicas within
  the timeout is counted (:attr:`ReplicaWait.short`) and logged, not an error: the call
  did run on the master, and refusing to go on would stop the crawl whenever a replica
  is down (Redis's own ``min-replicas-to-write`` is the setting that refuses writes).
- :class:`CrawlIdentity` (for a worker's frontier: ``FrontierCore.check_vanished``, which
  the Scrapy scheduler turns on): the crawl's control hash gets a random identity
  (:data:`IDENTITY_FIELD`) the first time the worker leases from it; a worker that finds the
  crawl finished checks that the identity is still the one it saw, and raises
  :class:`~redcrawl.errors.CrawlVanished` if the hash is gone or was created again (the
  next script call of any worker recreates the layout, so its mere existence proves
  nothing). A failover onto a replica that never received the crawl otherwise looks like
  a finished crawl. So does a purge by another process under a running worker (its
  message says so); a frontier's own purge starts it afresh.

See docs/cluster.md, "Durability".
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

import redis.exceptions

from redcrawl.errors import CrawlVanished
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = ["IDENTITY_FIELD", "WAITED", "WORK", "CrawlIdentity", "ReplicaWait", "works"]

log = logging.getLogger(__name__)

WAITED = frozenset(("push", "lease", "settle", "nack", "release", "release_worker", "requeue_dead"))
"""Frontier scripts followed by a WAIT when ``REDCRAWL_WAIT_REPLICAS`` is on: the ones
whose loss in a failover loses or repeats work. Not waited for: heartbeats, maintenance
(reclaims and promotions a failover undoes are done again), ``disown`` (the same: the
orphans it took back are in flight again under their live worker, whose next disown
takes them back; and a WAIT after any later call covers it, replication being in order),
politeness bookkeeping."""

WORK = frozenset(("lease", "nack", "release"))
"""Frontier scripts only a worker runs (it holds leases): after the first that succeeds,
the frontier remembers the crawl's identity (:class:`CrawlIdentity`); so does a settle
that acks or leases (:func:`works`). Pushes alone (the API, ``redcrawl seed``, a feeder)
do not make a frontier a worker of the crawl."""


def works(name: str, args: Sequence[Any]) -> bool:
    """Whether the frontier script call ``name`` with ``args`` (after the common ARGV) is
    a worker's: a :data:`WORK` script, or a settle that acks (``args[1]``) or leases
    (``args[2]``)."""
    return name in WORK or (name == "settle" and bool(args[1] or args[2]))


IDENTITY_FIELD = "crawl.id"
"""Field of the crawl's control hash: a random identity, set once (HSETNX)."""

WARN_EVERY = 60.0
"""Seconds between two warnings about replicas that did not acknowledge in time."""


class ReplicaWait:
    """``WAIT replicas timeout`` after each :data:`WAITED` call of one frontier, and the
    count of calls whose WAIT saw fewer replicas than asked (:attr:`short`)."""

    def __init__(self, replicas: int, timeout: float, crawl: str) -> None:
        self.replicas = replicas
        self.timeout_ms = max(1, round(timeout * 1000))
        self.crawl = crawl
        self.calls = 0
        """Calls waited for."""
        self.short = 0
        """Calls whose WAIT returned fewer replicas than asked (or an error)."""
        self._warned_at: float | None = None
        self._short_since_warning = 0

    @classmethod
    def of(cls, settings: Settings, crawl: str) -> ReplicaWait | None:
        """The waiter ``settings`` ask for, or None when ``wait_replicas`` is 0."""
        if not settings.wait_replicas:
            return None
        return cls(settings.wait_replicas, settings.wait_timeout, crawl)

    def command(self) -> tuple[str, int, int]:
        """The WAIT command to send after a call, on its connection."""
        return ("WAIT", self.replicas, self.timeout_ms)

    def options(self, client: Any, key: str) -> dict[str, Any]:
        """Options of the WAIT in ``client``'s pipeline: on a Redis Cluster, the master of
        ``key``'s slot (where the call ran; a WAIT has no key to route by)."""
        node_of = getattr(client, "get_node_from_key", None)
        return {} if node_of is None else {"target_nodes": node_of(key)}

    def account(self, acked: Any) -> None:
        """Count a WAIT's reply (the number of replicas that acknowledged, or the error
        Redis answered); warn, at most every :data:`WARN_EVERY` seconds, when short."""
        self.calls += 1
        if not isinstance(acked, Exception) and int(acked) >= self.replicas:
            return
        self.short += 1
        self._short_since_warning += 1
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < WARN_EVERY:
            return
        self._warned_at = now
        got = f"Redis answered {acked}" if isinstance(acked, Exception) else f"{acked}"
        log.warning(
            "redcrawl: crawl %s: %d call(s) returned before %d replica(s) had their writes "
            "(%s acknowledged within REDCRAWL_WAIT_TIMEOUT = %.3f s); a failover now can "
            "undo them. Check the master's replicas (INFO replication); the crawl goes on",
            self.crawl,
            self._short_since_warning,
            self.replicas,
            got,
            self.timeout_ms / 1000,
        )
        self._short_since_warning = 0

    def run(self, frontier: Any, name: str, keys: list[str], argv: list[Any]) -> Any:
        """Run the frontier script ``name`` and WAIT after it, in one pipeline (one
        connection, one round trip); the script's reply."""
        client = frontier.client
        script = frontier._scripts[name]
        for first in (True, False):
            pipe = client.pipeline(transaction=False)
            if first:  # EVALSHA as is: no SCRIPT EXISTS round trip before the pipeline
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)
                pipe.load_scripts_first = False  # (redcrawl's cluster pipeline)
            else:  # the server lacked the script (a restart, a promoted replica)
                frontier._scripts.run(name, keys, argv, client=pipe)
            pipe.execute_command(*self.command(), **self.options(client, keys[0]))
            with redis_errors(name):
                reply, acked = pipe.execute(raise_on_error=False)
                if first and isinstance(reply, redis.exceptions.NoScriptError):
                    continue  # it did not run: load it and run it
                if isinstance(reply, Exception):
                    raise reply
            self.account(acked)
            return reply
        raise AssertionError("unreachable")


class CrawlIdentity:
    """The identity of the crawl a frontier works on (see the module docstring)."""

    def __init__(self, client: Any, key: str, crawl: str) -> None:
        self.client = client
        self.key = key
        self.crawl = crawl
        self.id: bytes | None = None
        """The identity this frontier saw when it first worked on the crawl."""

    def remember(self) -> None:
        """Read the crawl's identity, setting it if it has none (once per frontier)."""
        if self.id is not None:
            return
        with redis_errors("reading the crawl's identity"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hsetnx(self.key, IDENTITY_FIELD, secrets.token_hex(8))
            pipe.hget(self.key, IDENTITY_FIELD)
            _new, found = pipe.execute()
        self.id = found

    def forget(self) -> None:
        """This frontier purged the crawl: what comes next is a new crawl."""
        self.id = None

    def check(self) -> None:
        """:class:`CrawlVanished` if this frontier worked on the crawl and its control
        hash is gone or holds another identity."""
        if self.id is None:
            return
        with redis_errors("reading the crawl's identity"):
            found = self.client.hget(self.key, IDENTITY_FIELD)
        if found == self.id:
            return
        if found is None:
            raise CrawlVanished(
                self.crawl, f"its control hash {self.key} is gone, or was created again"
            )
        raise CrawlVanished(
            self.crawl,
            f"its control hash {self.key} belongs to a crawl created since "
            f"(identity {found!r}, was {self.id!r})",
        )
