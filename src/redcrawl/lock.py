"""A token-owned distributed lock for crawl-level one-off actions.

Acquired with ``SET key token NX PX ttl``; released and renewed by Lua scripts
(``lua/lock_*.lua``) that act only while the stored token is the caller's, so a worker
whose lock expired can never release or extend another worker's lock.

>>> with CrawlLock(client, keys, "flush", ttl=30) as lock:   # doctest: +SKIP
...     if lock.acquired: ...
"""

from __future__ import annotations

import secrets
import time
from functools import cache
from importlib import resources
from types import TracebackType

import redis

from redcrawl.errors import LockError
from redcrawl.frontier.lists import redis_errors
from redcrawl.keys import CrawlKeys

__all__ = ["CrawlLock"]


@cache
def _source(name: str) -> str:
    return (resources.files("redcrawl") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


class CrawlLock:
    """The crawl-level lock ``name``, held for ``ttl`` seconds unless renewed."""

    def __init__(self, client: redis.Redis, keys: CrawlKeys, name: str, *, ttl: float = 30.0,
                 wait: float = 0.0) -> None:
        self.client = client
        self.key = keys.lock(name)
        self.ttl_ms = max(1, int(ttl * 1000))
        self.wait = wait
        self.token = secrets.token_hex(16)
        self.acquired = False
        self._release = client.register_script(_source("lock_release"))
        self._renew = client.register_script(_source("lock_renew"))

    def acquire(self, wait: float | None = None) -> bool:
        """Try to take the lock, polling for up to ``wait`` seconds. True if taken."""
        deadline = time.monotonic() + (self.wait if wait is None else wait)
        with redis_errors("lock acquire"):
            while True:
                if self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                    self.acquired = True
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)

    def renew(self, ttl: float | None = None) -> None:
        """Extend the lock; :class:`LockError` if it is no longer ours."""
        ms = self.ttl_ms if ttl is None else max(1, int(ttl * 1000))
        with redis_errors("lock renew"):
            ok = self._renew(keys=[self.key], args=[self.token, ms])
        if not ok:
            self.acquired = False
            raise LockError(f"lock {self.key} expired or is held by another owner; "
                            "renew it more often than its ttl")

    def release(self) -> bool:
        """Release the lock if it is still ours. Returns False if it was not."""
        with redis_errors("lock release"):
            ok = bool(self._release(keys=[self.key], args=[self.token]))
        self.acquired = False
        return ok

    def owned(self) -> bool:
        with redis_errors("lock check"):
            return self.client.get(self.key) == self.token.encode()

    def __enter__(self) -> CrawlLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.acquired:
            self.release()
