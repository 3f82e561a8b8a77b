"""Seeding a crawl: start URLs pushed straight into its frontier, fingerprinted and
deduplicated as the scheduler does it (``redcrawl seed``; tests)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from redcrawl import codec
from redcrawl.callbacks import callback_name_problem
from redcrawl.connection import connect
from redcrawl.errors import EncodeError
from redcrawl.fingerprint import fingerprinter_for
from redcrawl.frontier import PushResult, open_frontier
from redcrawl.settings import Settings
from redcrawl.urls import url_problem

__all__ = ["seed"]


def seed(
    urls: Iterable[str],
    *,
    settings: Settings,
    crawl: str,
    callback: str | None = None,
    priority: int = 0,
    client: Any = None,
    recrawl: bool = False,
) -> PushResult:
    """Push start URLs straight into a crawl's frontier (durable, deduplicated the way
    the scheduler dedupes). ``callback`` names a spider method (default: ``parse``).
    ``recrawl``: URLs already DONE are accepted again. A URL that is not a crawlable
    http(s) URL (:func:`redcrawl.urls.url_problem`) or a callback name no spider may
    have (:func:`redcrawl.callbacks.callback_name_problem`) is an
    :class:`~redcrawl.errors.EncodeError` and nothing is stored."""
    urls = list(urls)
    for url in urls:
        problem = url_problem(url)
        if problem:
            raise EncodeError(f"{url!r}: {problem}; nothing was seeded")
    if callback is not None and (problem := callback_name_problem(callback)):
        raise EncodeError(f"callback {problem}; nothing was seeded")
    frontier = open_frontier(client or connect(settings), settings, crawl, follow_layout=True)
    fp = fingerprinter_for(settings, frontier.client, frontier.keys)
    envs = [
        codec.Envelope(url=u, callback=callback, priority=priority, fingerprint=fp.url(u))
        for u in map(codec.request_url, urls)
    ]
    return frontier.push(envs, recrawl=recrawl)
