"""A token-owned distributed lock for crawl-level one-off actions, on redis-py's ``Lock``.

:class:`redis.lock.Lock` does the work: ``SET key token NX PX ttl`` to acquire, and Lua
scripts that release or extend the lock only while the stored token is the caller's, so a
worker whose lock expired can never release or extend another worker's lock. This class
keeps one token per owner (so a test or an operator can see who holds the key), keeps the
token out of thread-local storage (a lock taken in one thread may be released in
another), and turns redis-py's ``LockError``/``LockNotOwnedError`` into
:class:`redcrawl.errors.LockError` with a message that says what to do.

>>> with CrawlLock(client, keys, "flush", ttl=30) as lock:   # doctest: +SKIP
...     if lock.acquired: ...
"""

from __future__ import annotations

import secrets
from types import TracebackType

import redis
import redis.exceptions
import redis.lock

from redcrawl.errors import LockError
from redcrawl.keys import CrawlKeys
from redcrawl.transport import redis_errors

__all__ = ["CrawlLock"]

POLL = 0.05
"""Seconds between attempts while waiting for a lock held elsewhere."""


class CrawlLock:
    """The crawl-level lock ``name``, held for ``ttl`` seconds unless renewed."""

    def __init__(
        self,
        client: redis.Redis,
        keys: CrawlKeys,
        name: str,
        *,
        ttl: float = 30.0,
        wait: float = 0.0,
    ) -> None:
        self.client = client
        self.key = keys.lock(name)
        self.ttl_ms = max(1, int(ttl * 1000))
        self.wait = wait
        self.token = secrets.token_hex(16)
        self.acquired = False
        self._lock = redis.lock.Lock(
            client, self.key, timeout=self.ttl_ms / 1000, sleep=POLL, thread_local=False
        )

    def acquire(self, wait: float | None = None) -> bool:
        """Try to take the lock, polling for up to ``wait`` seconds. True if taken."""
        wait = self.wait if wait is None else wait
        with redis_errors("lock acquire"):
            taken = self._lock.acquire(
                blocking=wait > 0, blocking_timeout=max(wait, 0.0), token=self.token
            )
        self.acquired = bool(taken)
        return self.acquired

    def renew(self, ttl: float | None = None) -> None:
        """Set the lock's remaining time to ``ttl`` (default: its own ttl);
        :class:`LockError` if it is no longer ours."""
        seconds = self.ttl_ms / 1000 if ttl is None else max(1, int(ttl * 1000)) / 1000
        try:
            with redis_errors("lock renew"):
                self._lock.extend(seconds, replace_ttl=True)
        except redis.exceptions.LockError as exc:  # LockNotOwnedError is one
            self.acquired = False
            raise LockError(
                f"lock {self.key} expired or is held by another owner ({exc}); "
                "renew it more often than its ttl"
            ) from exc

    def release(self) -> bool:
        """Release the lock if it is still ours. Returns False if it was not."""
        self.acquired = False
        try:
            with redis_errors("lock release"):
                self._lock.release()
        except redis.exceptions.LockError:  # not taken, expired, or taken by another owner
            return False
        return True

    def owned(self) -> bool:
        """Whether the lock's key holds this owner's token."""
        with redis_errors("lock check"):
            return bool(self.client.get(self.key) == self.token.encode())

    def __enter__(self) -> CrawlLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.acquired:
            self.release()
