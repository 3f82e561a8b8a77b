"""Fleet-wide politeness in words and numbers, for the people who run a crawl.

* :func:`fleet_limits` — the per-site limits a crawl's workers enforce together, in one
  phrase: said by ``redcrawl crawl`` before it starts its workers and by each Scrapy
  worker at start (``scrapy crawl`` users see it in the log), built here once.
* :class:`PolitenessSummary` / :func:`politeness_summary` — the crawl-wide politeness
  counters (``FrontierCore.politeness_stats()``: deferrals by reason, keys blocked now,
  politeness wait) as ``redcrawl status`` and ``GET /v1/crawls/{crawl}`` show them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from redcrawl.frontier import FrontierCore
    from redcrawl.settings import Settings

__all__ = ["PolitenessSummary", "fleet_limits", "politeness_summary"]


def _plural(n: float, word: str) -> str:
    return f"{n:g} {word}{'s' * (n != 1)}"


def fleet_limits(settings: Settings, *, robots: bool | None = None) -> str:
    """The per-site limits ``settings`` give a crawl with fleet-wide politeness, for all
    its workers together: concurrency per site, delay and jitter, per-slot settings,
    AutoThrottle, 429/503 deferral and (when ``robots`` is known: ROBOTSTXT_OBEY) the
    shared robots.txt. One phrase, no final full stop."""
    s = settings
    conc = s.politeness_concurrency_per_ip or s.politeness_concurrency
    name = (
        "CONCURRENT_REQUESTS_PER_IP"
        if s.politeness_concurrency_per_ip
        else ("CONCURRENT_REQUESTS_PER_DOMAIN")
    )
    delay = s.politeness_delay
    pace = (
        f"one every {delay:g} s{' (±50%)' if s.politeness_randomize else ' (no jitter)'} "
        "(DOWNLOAD_DELAY)"
        if delay
        else "no delay (DOWNLOAD_DELAY 0)"
    )
    parts = [f"at most {_plural(conc, 'request')} at once per site ({name}), {pace}"]
    if s.politeness_slots:
        parts.append(f"{len(s.politeness_slots)} key(s) with their own in DOWNLOAD_SLOTS")
    if not s.autothrottle_enabled:
        parts.append("AutoThrottle off")
    elif s.autothrottle_shared:
        parts.append(
            "AutoThrottle on, one delay per site for the fleet (start "
            f"{s.autothrottle_start_delay:g} s, max {s.autothrottle_max_delay:g} s, target "
            f"concurrency {s.autothrottle_target_concurrency:g})"
        )
    else:
        parts.append("AutoThrottle on, per worker (REDCRAWL_AUTOTHROTTLE_SHARED off)")
    codes = "/".join(str(c) for c in s.defer_http_codes)
    parts.append(
        f"{codes} block the site for the fleet (Retry-After, else backoff; at most "
        f"{s.max_deferrals} deferrals per request)"
        if codes
        else "no deferral on 429/503 (REDCRAWL_DEFER_HTTP_CODES empty)"
    )
    if robots is not None:
        parts.append(
            (
                "robots.txt obeyed, fetched once per site for the fleet"
                if s.robots_shared
                else "robots.txt obeyed, fetched by each worker (REDCRAWL_ROBOTS_SHARED off)"
            )
            if robots
            else "robots.txt not obeyed (ROBOTSTXT_OBEY off)"
        )
    return "; ".join(parts)


@dataclass(frozen=True)
class PolitenessSummary:
    """A crawl's politeness counters (crawls with fleet-wide politeness)."""

    __pydantic_config__: ClassVar[dict[str, bool]] = {"use_attribute_docstrings": True}
    """(the API's model of it takes each field's description from its docstring)"""

    key: str
    """What a politeness key groups: ``host`` or ``domain`` (REDCRAWL_POLITENESS_KEY)."""
    blocked: int
    """Keys blocked now by a 429/503 (their block is not over)."""
    deferred: dict[str, int]
    """Deferrals by reason (the HTTP status: ``{"429": 3, "503": 1}``), crawl-wide."""
    wait_s: float
    """Seconds keys with ready work spent closed by their limits, summed over grants
    (``politeness_wait_ms``; docs/politeness.md)."""

    @property
    def deferred_total(self) -> int:
        return sum(self.deferred.values())


def politeness_summary(frontier: FrontierCore) -> PolitenessSummary | None:
    """The crawl's politeness counters, or None when it has no fleet-wide politeness.
    Bounded: one pipelined read of the crawl's stats hash (a few dozen fields) and a
    ``ZCOUNT``."""
    if frontier.politeness is None:
        return None
    raw = frontier.politeness_stats()
    deferred = {
        k.removeprefix("deferred_"): v for k, v in sorted(raw.items()) if k.startswith("deferred_")
    }
    return PolitenessSummary(
        key=frontier.politeness,
        blocked=raw.get("blocked", 0),
        deferred=deferred,
        wait_s=raw.get("politeness_wait_ms", 0) / 1000,
    )
