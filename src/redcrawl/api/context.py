"""What every route of the API shares: the settings, the Redis client, the frontiers of
the crawls, the access dependencies and rate samples (one :class:`Context` per app)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any

import redis
from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.params import Depends as DependsParam
from pydantic import BeforeValidator

from redcrawl.api import models as m
from redcrawl.api.auth import require
from redcrawl.api.errors import ServerRefused
from redcrawl.api.rates import RateBook
from redcrawl.errors import ConfigError
from redcrawl.fingerprint import canonicalizer_for
from redcrawl.frontier import Counts, FrontierCore
from redcrawl.frontier.opened import OpenFrontiers
from redcrawl.guard import check_memory_policy
from redcrawl.keys import CRAWL_NAME_PATTERN, CrawlKeys
from redcrawl.metrics.registry import alive
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = ["Context", "Crawl", "Limit", "single_values"]

log = logging.getLogger("redcrawl.api")

Crawl = Annotated[str, Path(pattern=CRAWL_NAME_PATTERN, description="Crawl name.")]


def _digits(value: Any) -> Any:
    # a query string is text: only plain digits are a whole number ("4\f", "+4", "4.0" are not)
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) < 10):
        raise ValueError("give a whole number, e.g. 100")
    return value


Limit = Annotated[
    int,
    Query(ge=1, le=m.MAX_LIST_LIMIT, description="Most items returned."),
    BeforeValidator(_digits),
]


async def single_values(request: Request) -> None:
    """Refuse a query parameter given more than once (which one would count?)."""
    for name in set(request.query_params.keys()):
        if len(request.query_params.getlist(name)) > 1:
            raise RequestValidationError(
                [
                    {
                        "loc": ("query", name),
                        "type": "value_error",
                        "msg": "given more than once: give it once",
                    }
                ]
            )


class Context:
    """The app's shared state. ``redis``: the client (set at startup when not given)."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis | None,
        *,
        clock: Callable[[], float] | None = None,
        check_server: bool = False,
    ) -> None:
        self.settings = settings
        self.redis = client
        self.rates = RateBook() if clock is None else RateBook(clock)
        self.canonicalizer = canonicalizer_for(settings)
        self.read: list[DependsParam] = [Depends(require(settings, "read"))]
        self.admin: list[DependsParam] = [Depends(require(settings, "admin"))]
        self.frontiers = OpenFrontiers(self.client, settings, 256)
        self._guard_pending = check_server
        self._guard_refusal: str | None = None
        self._guard_lock = threading.Lock()

    def client(self) -> Any:
        """The Redis client; with ``check_server`` (``serve`` started while its Redis
        was down) the server's eviction policy is checked first, once it answers
        (:func:`redcrawl.guard.check_memory_policy`): an evicting server is refused with
        :class:`ServerRefused` (503) on every call, as ``serve`` exits 2 at start."""
        if self._guard_pending or self._guard_refusal is not None:
            self._guard()
        return self.redis

    def _guard(self) -> None:
        with self._guard_lock:
            if self._guard_pending:
                try:
                    warnings = check_memory_policy(self.redis, self.settings)
                except ConfigError as exc:  # (a Redis error propagates: checked next time)
                    self._guard_refusal = str(exc)
                    warnings = []
                self._guard_pending = False
                for warning in warnings:
                    log.warning("redcrawl API: %s", warning)
        if self._guard_refusal is not None:
            raise ServerRefused(f"refused to use this Redis server: {self._guard_refusal}")

    def frontier(self, crawl: str) -> FrontierCore:
        """The crawl's frontier (kept; opened again if the crawl was made again with
        another layout since: :class:`~redcrawl.frontier.opened.OpenFrontiers`)."""
        return self.frontiers.get(crawl)

    def stats_key(self, crawl: str) -> str:
        return CrawlKeys(crawl, prefix=self.settings.key_prefix, tiers=self.settings.tiers).stats

    def alive(self, crawls: list[str]) -> list[bool]:
        """Whether each crawl exists (:func:`redcrawl.metrics.registry.alive`: a purged
        crawl is gone until a request is submitted again)."""
        with redis_errors("reading the crawls' counts"):
            return alive(self.client(), self.settings.key_prefix, crawls)

    def existing(self, crawl: str) -> FrontierCore:
        """The frontier of ``crawl``; 404 if the crawl does not exist."""
        if not self.alive([crawl])[0]:
            raise HTTPException(
                404,
                f"crawl {crawl!r} does not exist (no request was "
                "submitted to it since it was created or purged); list "
                "crawls with GET /v1/crawls",
            )
        return self.frontier(crawl)

    @staticmethod
    def summary(crawl: str, c: Counts, lost: list[int]) -> dict[str, Any]:
        """The counts as fields of a response (derived from :class:`Counts`); a crawl
        whose partitions lost their state (``lost``) is not finished."""
        finished = c.finished and not lost
        return {"crawl": crawl, **dataclasses.asdict(c), "finished": finished}

    def server_time(self) -> float:
        with redis_errors("reading the server's clock"):
            sec, usec = self.client().time()
        return float(sec) + float(usec) / 1e6
