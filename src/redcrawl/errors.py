"""The errors redcrawl raises.

Every error is a :class:`RedcrawlError`; Redis client exceptions are converted at the
boundary (``raise ConnectionLost(...) from exc``) so callers never need to import
``redis.exceptions``. Messages say what to do about the problem.

::

    RedcrawlError
    ├── ConfigError            a setting is unknown, malformed or out of range
    ├── UnknownSpider          the spider to run does not exist (lists the ones that do)
    ├── EncodeError            a request cannot be stored (e.g. meta that isn't serialisable)
    ├── DecodeError            a stored envelope is corrupt or from an unknown version
    ├── ConnectionError_       Redis could not be reached or was lost
    │   ├── RedisUnavailable   the configured server did not answer (names the URL)
    │   └── ConnectionLost     the server went away and retries ran out
    ├── LockError              a distributed lock was not held by its owner
    └── FrontierError          Redis refused a frontier operation
        ├── LayoutMismatch     this worker's settings would change the crawl's layout
        ├── RedisOutOfMemory   Redis refused a write: its maxmemory is reached
        └── CrawlVanished      the crawl's state disappeared under a worker (failover, purge)
            └── PartitionsLost partitions of a partitioned crawl lost their state
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ConfigError",
    "ConnectionError_",
    "ConnectionLost",
    "CrawlVanished",
    "DecodeError",
    "EncodeError",
    "FrontierError",
    "LayoutMismatch",
    "LockError",
    "PartitionsLost",
    "RedcrawlError",
    "RedisOutOfMemory",
    "RedisUnavailable",
    "UnknownSpider",
]


class RedcrawlError(Exception):
    """Base class of every error raised by redcrawl."""


class ConfigError(RedcrawlError, ValueError):
    """A setting is unknown, malformed or out of range. The message names the setting (or
    the command-line option or argument, ``kind``)."""

    def __init__(self, setting: str, problem: str, *, kind: str | None = None) -> None:
        self.setting = setting
        self.problem = problem
        if kind is None:  # a command-line option, a phrase of its own, else a setting
            kind = "option" if setting.startswith("-") else "" if " " in setting else "setting"
        super().__init__(f"{kind} {setting}: {problem}" if kind else f"{setting}: {problem}")


class UnknownSpider(RedcrawlError):
    """The spider to run does not exist; :attr:`available` lists the ones that do."""

    def __init__(self, message: str, available: Sequence[str] = ()) -> None:
        self.available = list(available)
        super().__init__(message)


class EncodeError(RedcrawlError, ValueError):
    """A request cannot be turned into an envelope; nothing was stored."""


class DecodeError(RedcrawlError, ValueError):
    """A stored envelope is corrupt or was written by an unknown (future) version."""


class ConnectionError_(RedcrawlError, ConnectionError):
    """Redis could not be reached or the connection was lost."""


class RedisUnavailable(ConnectionError_):
    """The configured Redis server did not answer (or refused this client's login:
    ``problem`` and ``fix`` then say so instead of the default words)."""

    DEFAULT_FIX = (
        "Check that the server is running and that REDCRAWL_REDIS_URL / REDIS_URL point at "
        "it, or unset them to use the embedded Redis."
    )

    def __init__(
        self, url: str, cause: object, *, problem: str | None = None, fix: str | None = None
    ) -> None:
        self.url = url
        super().__init__(
            f"{problem or 'cannot reach Redis'} at {url} ({cause}). {fix or self.DEFAULT_FIX}"
        )


class ConnectionLost(ConnectionError_):
    """The server went away during a crawl and the retries with backoff ran out."""


class LockError(RedcrawlError):
    """A distributed lock operation failed because the caller does not own the lock."""


class FrontierError(RedcrawlError):
    """The frontier refused a state change."""


class LayoutMismatch(FrontierError):
    """The crawl was created with another layout (backend, ordering, tiers, dedupe,
    politeness) than this worker's settings give; its message names the settings."""

    PREFIX = "crawl layout mismatch"
    """How the frontier's scripts begin this refusal (``lua/lib.lua``)."""

    NEWER = "by a newer redcrawl"
    """In the refusal of a worker older than the crawl (same settings, an unknown mark)."""

    @property
    def newer_redcrawl(self) -> bool:
        """The crawl has this worker's settings and a mark of a newer redcrawl: upgrading
        the worker is the answer, not a setting."""
        return self.NEWER in str(self)


class RedisOutOfMemory(FrontierError):
    """Redis refused a write because it reached its ``maxmemory`` (policy ``noeviction``,
    as redcrawl requires): nothing of the refused call was applied."""

    def __init__(self, what: str, cause: object) -> None:
        super().__init__(
            f"Redis is out of memory: it refused {what} because its maxmemory is reached "
            f"({cause}); nothing of that call was stored. Free memory or raise maxmemory "
            "(CONFIG SET maxmemory ..., or in redis.conf; REDCRAWL_DEDUPE=bloom shrinks the "
            "fingerprint filter), then start the workers again: the requests they held come "
            "back when their leases expire (REDCRAWL_LEASE_TTL)"
        )


class CrawlVanished(FrontierError):
    """The crawl's state disappeared while this worker was working on it: its control
    hash (which holds the layout every created crawl has, and the crawl's identity) is
    gone or belongs to a crawl created since. A Redis failover onto a replica that had
    not received the crawl (docs/cluster.md, "Durability"), a Redis restart without
    persistence, or a purge or flush by someone else. Raised instead of reporting the
    crawl finished: its remaining work is lost, not done."""

    def __init__(self, crawl: str, what: str, *, message: str | None = None) -> None:
        self.crawl = crawl
        super().__init__(
            message
            or f"crawl {crawl!r} vanished while this worker was working on it ({what}): its "
            "state is gone from Redis, so its remaining requests were lost, not finished. "
            "If Redis failed over or restarted, check its persistence and replication "
            "(REDCRAWL_WAIT_REPLICAS, docs/cluster.md) and seed the crawl again; if "
            "someone purged it on purpose, stop its workers"
        )


class PartitionsLost(CrawlVanished):
    """Partitions of a partitioned crawl lost their state (their master came back empty)
    while the others kept theirs: the crawl cannot be finished as it was (the requests
    those partitions held are gone). Raised to a worker instead of reporting the crawl
    finished; ``redcrawl status`` reports the partitions."""

    def __init__(self, crawl: str, lost: Sequence[int], n: int) -> None:
        self.lost = list(lost)
        super().__init__(crawl, "", message=partitions_lost_text(crawl, self.lost, n))


def partitions_lost_text(crawl: str, lost: Sequence[int], n: int) -> str:
    """What :class:`PartitionsLost` says (``redcrawl status`` and the API say it too)."""
    plural = len(lost) > 1
    return (
        f"crawl {crawl!r}: partition{'s' * plural} {', '.join(map(str, lost))} of 0..{n - 1} "
        f"lost {'their' if plural else 'its'} state (a Redis master came back empty: a "
        "restart without persistence, or a failover to a replica that never got it), and "
        "with it the requests queued, in flight and done there; the other partitions are "
        "intact. `redcrawl status` shows what is left; `redcrawl accept-loss` goes on "
        "without them (seed the crawl again to fetch their sites anew), `redcrawl purge` "
        "starts over"
    )
