"""How long a site waits after it pushed back: ``Retry-After``, and backoff without it.

Pure functions of their arguments (the time and the random number are passed in), so the
rules are testable and the frontier can apply them in Python or mirror them in Lua.

``Retry-After`` (RFC 9110 §10.2.3) is ``delay-seconds`` (1*DIGIT) or an ``HTTP-date`` in
any of the three forms a recipient must accept (§5.6.7: IMF-fixdate, RFC 850, asctime).
:func:`parse_retry_after` turns it into seconds from ``now``:

* unparsable (empty, a sign, a fraction, words, a bad date): None;
* a date not after ``now`` (the server's clock is behind, or the header is stale): None;
* more than :data:`ABSURD_RETRY_AFTER` seconds (a year): None;
* otherwise the delay, capped at ``cap`` (``RetryAfter.capped`` says when the cap bit).

None means "the header tells us nothing": the caller falls back to :func:`backoff_delay`.

Backoff (:class:`BackoffPolicy`): after ``n`` consecutive failures the site waits
``d = min(cap, base * 2**(n-1))`` scaled by jitter into ``[d * (1 - jitter), d]``; zero
failures wait nothing. Success forgives slowly: every ``forgive_after`` consecutive
successes take one failure off the count, so a site that recovers returns to full speed
over a few rounds and a site that flaps stays slowed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from redcrawl.errors import ConfigError

__all__ = [
    "ABSURD_RETRY_AFTER",
    "DEFAULT_RETRY_AFTER_CAP",
    "BackoffPolicy",
    "BackoffState",
    "RetryAfter",
    "backoff_delay",
    "forgive",
    "parse_retry_after",
]

DEFAULT_RETRY_AFTER_CAP = 3600.0
"""Seconds: the longest a ``Retry-After`` blocks a site by default (an hour)."""

ABSURD_RETRY_AFTER = 365 * 86400.0
"""Seconds: a ``Retry-After`` beyond this (a year) is taken as garbage, not as a request."""

_DIGITS = re.compile(r"[0-9]{1,16}")
_DAYS = "Mon|Tue|Wed|Thu|Fri|Sat|Sun"
_LONG_DAYS = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MON = "|".join(_MONTHS)
_TIME = r"(?P<H>[0-9]{2}):(?P<M>[0-9]{2}):(?P<S>[0-9]{2})"
# RFC 9110 §5.6.7: IMF-fixdate, then the two obsolete forms (RFC 850, asctime). Parsed by
# hand rather than with strptime, whose day and month names follow the process's locale.
_DATE_FORMS = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        rf"(?:{_DAYS}), (?P<d>[0-9]{{2}}) (?P<b>{_MON}) (?P<Y>[0-9]{{4}}) {_TIME} GMT",
        rf"(?:{_LONG_DAYS}), (?P<d>[0-9]{{2}})-(?P<b>{_MON})-(?P<y>[0-9]{{2}}) {_TIME} GMT",
        rf"(?:{_DAYS}) (?P<b>{_MON}) (?P<d>[ 0-9][0-9]) {_TIME} (?P<Y>[0-9]{{4}})",
    )
)


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """A parsed ``Retry-After``: the delay to apply and the one the server asked for."""

    delay: float
    requested: float

    @property
    def capped(self) -> bool:
        """The cap shortened the server's request (say so in logs and stats)."""
        return self.delay < self.requested


def _http_date(text: str) -> float | None:
    """Unix seconds of an HTTP-date in any of its three forms, or None."""
    for form in _DATE_FORMS:
        m = form.fullmatch(text)
        if m is None:
            continue
        fields = m.groupdict()
        if fields.get("Y") is not None:
            year = int(fields["Y"])
        else:  # RFC 850's two digits: a year more than 50 years ahead is in the past
            year = 2000 + int(fields["y"])
            if year > datetime.now(UTC).year + 50:
                year -= 100
        month = [m.lower() for m in _MONTHS].index(fields["b"].lower()) + 1
        try:
            when = datetime(
                year,
                month,
                int(fields["d"]),
                int(fields["H"]),
                int(fields["M"]),
                int(fields["S"]),
                tzinfo=UTC,
            )
        except ValueError:  # 32 Nov, 25:00:00, ...
            return None
        return when.timestamp()
    return None


def parse_retry_after(
    value: str | bytes | None, now: float, *, cap: float = DEFAULT_RETRY_AFTER_CAP
) -> RetryAfter | None:
    """The delay a ``Retry-After`` header asks for, from ``now`` (Unix seconds), or None
    when it tells nothing usable (see the module docstring for each case)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    text = value.strip()
    if _DIGITS.fullmatch(text):
        requested = float(int(text))
    else:
        when = _http_date(text)
        if when is None:
            return None
        requested = when - now
        if requested <= 0:
            return None
    if not math.isfinite(requested) or requested > ABSURD_RETRY_AFTER:
        return None
    return RetryAfter(delay=min(requested, max(cap, 0.0)), requested=requested)


def backoff_delay(failures: int, *, base: float, cap: float, jitter: float, rand: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures: ``min(cap, base *
    2**(failures-1))`` scaled into ``[d * (1 - jitter), d]`` by ``rand`` in [0, 1]."""
    if failures < 0:
        raise ValueError(f"failures is {failures}: it counts failures, so it is 0 or more")
    if not 0.0 <= rand <= 1.0:
        raise ValueError(f"rand is {rand}: pass random.random() (a number in [0, 1])")
    if failures == 0:
        return 0.0
    exponent = min(failures - 1, 1023)  # 2**1023 * base is past any cap; no overflow
    d = min(cap, base * math.ldexp(1.0, exponent)) if base < cap else cap
    return d * (1.0 - jitter + jitter * rand)


def forgive(failures: int, successes: int, forgive_after: int) -> tuple[int, int]:
    """(failures, successes) after one more success: every ``forgive_after`` consecutive
    successes take one failure off the count (and start the run again)."""
    if failures <= 0:
        return 0, 0
    successes += 1
    if successes >= forgive_after:
        return failures - 1, 0
    return failures, successes


@dataclass(frozen=True, slots=True)
class BackoffState:
    """A site's backoff state: consecutive failures, and successes since the last step
    of forgiveness (two integers, as the frontier keeps them per key)."""

    failures: int = 0
    successes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class BackoffPolicy:
    """The backoff rules of a crawl. Every field is checked when the policy is built."""

    base: float = 1.0
    """Seconds after the first failure (before jitter)."""
    cap: float = 300.0
    """The longest backoff, in seconds."""
    jitter: float = 0.5
    """Fraction of the delay that is random: 0 none, 1 anywhere in [0, d]."""
    forgive_after: int = 10
    """Consecutive successes that take one failure off the count."""
    retry_after_cap: float = DEFAULT_RETRY_AFTER_CAP
    """The longest a ``Retry-After`` is honoured, in seconds."""

    def __post_init__(self) -> None:
        for name in ("base", "cap", "retry_after_cap"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ConfigError(
                    f"backoff {name}", f"{v!r} is not a positive number of seconds: give one"
                )
        if self.cap < self.base:
            raise ConfigError(
                "backoff cap",
                f"{self.cap} is below base ({self.base}): raise the cap or lower the base",
            )
        if not (isinstance(self.jitter, int | float) and 0.0 <= self.jitter <= 1.0):
            raise ConfigError(
                "backoff jitter", f"{self.jitter!r} is not a fraction in [0, 1]: give one"
            )
        if not (isinstance(self.forgive_after, int) and self.forgive_after >= 1):
            raise ConfigError(
                "backoff forgive_after",
                f"{self.forgive_after!r}: give a whole number of successes, 1 or more",
            )

    def delay(self, state: BackoffState, rand: float) -> float:
        """Seconds the site waits in ``state`` (0 with no failures)."""
        return backoff_delay(
            state.failures, base=self.base, cap=self.cap, jitter=self.jitter, rand=rand
        )

    def failed(self, state: BackoffState) -> BackoffState:
        """The state after one more failure (429/503 without a usable Retry-After)."""
        return BackoffState(failures=state.failures + 1, successes=0)

    def succeeded(self, state: BackoffState) -> BackoffState:
        """The state after one more success."""
        return BackoffState(*forgive(state.failures, state.successes, self.forgive_after))

    def retry_after(self, value: str | bytes | None, now: float) -> RetryAfter | None:
        """:func:`parse_retry_after` with this policy's cap."""
        return parse_retry_after(value, now, cap=self.retry_after_cap)
