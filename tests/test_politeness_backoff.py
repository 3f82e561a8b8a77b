"""Retry-After parsing (RFC 9110) and capped exponential backoff with jitter and
forgiveness: pure functions, the time and the random number passed in."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redcrawl.errors import ConfigError
from redcrawl.politeness import BackoffPolicy, backoff_delay, forgive, parse_retry_after
from redcrawl.politeness.backoff import (
    ABSURD_RETRY_AFTER,
    DEFAULT_RETRY_AFTER_CAP,
    BackoffState,
    RetryAfter,
)

# RFC 9110 §5.6.7's example instant, Sun, 06 Nov 1994 08:49:37 GMT
RFC_INSTANT = 784111777.0
NOW = RFC_INSTANT - 10.0


@pytest.mark.parametrize(
    "value, delay",
    [
        ("3", 3.0),
        ("0", 0.0),
        (" 120 ", 120.0),
        (b"30", 30.0),
        ("0003", 3.0),
    ],
)
def test_delay_seconds(value: str | bytes, delay: float) -> None:
    assert parse_retry_after(value, NOW) == RetryAfter(delay=delay, requested=delay)


@pytest.mark.parametrize(
    "value",
    [
        "Sun, 06 Nov 1994 08:49:37 GMT",  # IMF-fixdate
        "Sunday, 06-Nov-94 08:49:37 GMT",  # obsolete RFC 850
        "Sun Nov  6 08:49:37 1994",  # obsolete asctime
    ],
)
def test_http_date_in_all_three_forms_is_relative_to_now(value: str) -> None:
    assert parse_retry_after(value, NOW) == RetryAfter(delay=10.0, requested=10.0)
    assert parse_retry_after(value, NOW + 4.5) == RetryAfter(delay=5.5, requested=5.5)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "   ",
        "-1",
        "+5",
        "1.5",
        "1e3",
        "soon",
        "3 seconds",
        "0x10",
        "Sun, 06 Nov 1994 25:49:37 GMT",
        "Sun, 32 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 PST",
        "06 Nov 1994",
        b"\xff\xfe",
        "٣",  # Arabic-Indic 3
    ],
)
def test_unparsable_is_none(value: str | bytes | None) -> None:
    assert parse_retry_after(value, NOW) is None


def test_a_date_not_after_now_is_none() -> None:
    # the server's clock is behind ours, or the header is stale: back off instead
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", RFC_INSTANT) is None
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", RFC_INSTANT + 60) is None


def test_absurd_values_are_none() -> None:
    assert parse_retry_after(str(int(ABSURD_RETRY_AFTER) + 1), NOW) is None
    assert parse_retry_after("9" * 16, NOW) is None
    assert parse_retry_after("9" * 400, NOW) is None
    assert parse_retry_after("Fri, 01 Jan 2100 00:00:00 GMT", NOW) is None


def test_long_requests_are_capped_and_say_so() -> None:
    r = parse_retry_after("7200", NOW)
    assert r is not None and r.delay == DEFAULT_RETRY_AFTER_CAP and r.requested == 7200
    assert r.capped
    r = parse_retry_after("7200", NOW, cap=10)
    assert r is not None and r.delay == 10 and r.capped
    r = parse_retry_after("5", NOW, cap=10)
    assert r is not None and not r.capped


def test_policy_uses_its_own_cap() -> None:
    r = BackoffPolicy(retry_after_cap=30).retry_after("60", NOW)
    assert r == RetryAfter(delay=30.0, requested=60.0)


@pytest.mark.parametrize(
    "failures, expected",
    [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 60.0), (10_000, 60.0)],
)
def test_backoff_doubles_up_to_the_cap(failures: int, expected: float) -> None:
    assert backoff_delay(failures, base=1.0, cap=60.0, jitter=0.0, rand=0.7) == expected


def test_jitter_spreads_the_delay_below_its_top() -> None:
    lo = backoff_delay(3, base=1.0, cap=60.0, jitter=0.5, rand=0.0)
    hi = backoff_delay(3, base=1.0, cap=60.0, jitter=0.5, rand=1.0)
    assert (lo, hi) == (2.0, 4.0)
    assert backoff_delay(3, base=1.0, cap=60.0, jitter=1.0, rand=0.0) == 0.0


@given(
    failures=st.integers(0, 5000),
    base=st.floats(0.001, 100),
    cap=st.floats(0.001, 1e6),
    jitter=st.floats(0, 1),
    rand=st.floats(0, 1),
)
def test_backoff_is_bounded_and_finite(
    failures: int, base: float, cap: float, jitter: float, rand: float
) -> None:
    d = backoff_delay(failures, base=base, cap=cap, jitter=jitter, rand=rand)
    assert math.isfinite(d) and 0.0 <= d <= max(cap, 0.0) * (1 + 1e-12)
    if failures and jitter < 1:
        assert d >= min(base, cap) * (1 - jitter) * (1 - 1e-12)


@given(n=st.integers(1, 60), rand=st.floats(0, 1))
def test_backoff_never_shrinks_with_more_failures(n: int, rand: float) -> None:
    a = backoff_delay(n, base=0.5, cap=300.0, jitter=0.3, rand=rand)
    b = backoff_delay(n + 1, base=0.5, cap=300.0, jitter=0.3, rand=rand)
    assert b >= a


def test_backoff_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        backoff_delay(-1, base=1, cap=2, jitter=0, rand=0)
    with pytest.raises(ValueError, match=r"random\.random"):
        backoff_delay(1, base=1, cap=2, jitter=0, rand=1.5)


def test_forgiveness_takes_one_failure_off_per_run_of_successes() -> None:
    state = (4, 0)
    for _ in range(9):
        state = forgive(*state, forgive_after=10)
    assert state == (4, 9)
    state = forgive(*state, forgive_after=10)
    assert state == (3, 0)
    assert forgive(0, 0, 10) == (0, 0)
    assert forgive(1, 0, 1) == (0, 0)


def test_policy_failure_resets_the_run_of_successes() -> None:
    policy = BackoffPolicy(base=1.0, cap=8.0, jitter=0.0, forgive_after=3)
    s = BackoffState()
    assert policy.delay(s, 0.5) == 0.0
    for _ in range(5):
        s = policy.failed(s)
    assert s == BackoffState(5, 0) and policy.delay(s, 0.5) == 8.0
    s = policy.succeeded(policy.succeeded(s))
    assert s == BackoffState(5, 2)
    s = policy.failed(s)  # a failure before forgiveness: no credit
    assert s == BackoffState(6, 0)
    for _ in range(3 * 6):  # sustained success: back to no delay
        s = policy.succeeded(s)
    assert s == BackoffState(0, 0) and policy.delay(s, 0.5) == 0.0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"base": 0}, "base"),
        ({"base": -1}, "base"),
        ({"base": math.nan}, "base"),
        ({"cap": math.inf}, "cap"),
        ({"retry_after_cap": -5}, "retry_after_cap"),
        ({"base": 10, "cap": 5}, "cap"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": math.nan}, "jitter"),
        ({"forgive_after": 0}, "forgive_after"),
        ({"forgive_after": 2.5}, "forgive_after"),
    ],
)
def test_policy_refuses_bad_values_naming_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        BackoffPolicy(**kwargs)  # type: ignore[arg-type]


def test_http_dates_do_not_depend_on_the_locale() -> None:
    import locale

    saved = locale.setlocale(locale.LC_TIME)
    try:
        for name in ("de_DE.UTF-8", "fr_FR.UTF-8", "C.UTF-8"):
            try:
                locale.setlocale(locale.LC_TIME, name)
            except locale.Error:
                continue
            assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", NOW) == RetryAfter(
                delay=10.0, requested=10.0
            )
    finally:
        locale.setlocale(locale.LC_TIME, saved)


@pytest.mark.parametrize(
    "value, when",
    [
        ("Thu, 01 Jan 1970 00:00:10 GMT", 10.0),
        ("Friday, 01-Jan-99 00:00:10 GMT", 915148810.0),  # 2099 is over 50 years ahead: 1999
        ("Thu Jan  1 00:00:10 1970", 10.0),
        ("Wednesday, 01-Jan-25 00:00:00 GMT", 1735689600.0),
        ("sun, 06 nov 1994 08:49:37 gmt", RFC_INSTANT),  # case is forgiven
    ],
)
def test_http_date_fields(value: str, when: float) -> None:
    r = parse_retry_after(value, when - 1.0)
    assert r == RetryAfter(delay=1.0, requested=1.0)
