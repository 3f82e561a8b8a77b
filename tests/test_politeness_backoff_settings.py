"""The 429/503 backoff's settings (REDCRAWL_BACKOFF_BASE, _CAP, _JITTER, _FORGIVE_AFTER):
read and checked like every setting, stored in the crawl's control field ``backoff`` for
the Lua steps (the latest Scrapy worker's values win, as the crawl's other politeness
defaults), and applied by the frontier from the next failure or success of a key."""

from __future__ import annotations

import json
import logging

import pytest

from redcrawl.errors import ConfigError
from redcrawl.frontier import FrontierCore
from redcrawl.politeness import BackoffPolicy
from redcrawl.settings import Settings

from .conftest import Clock, FrontierFactory
from .test_politeness_frontier import conserved, polite, site

pytestmark = pytest.mark.backends("lists")

OK = "s"  # slot_outcome(200)


def block_ms(f: FrontierCore, key: str, clock: Clock) -> int:
    return int(f.client.hget(f.keys.pol_state_base + key, "block") or 0) - clock.ms


def failures(f: FrontierCore, key: str) -> int:
    return int(f.client.hget(f.keys.pol_state_base + key, "fail") or 0)


# --- the settings ------------------------------------------------------------------------


def test_defaults_are_the_policy_defaults() -> None:
    assert Settings().backoff_policy == BackoffPolicy()


def test_read_from_the_environment_and_scrapy_settings() -> None:
    s = Settings.from_env(
        {
            "REDCRAWL_BACKOFF_BASE": "2.5",
            "REDCRAWL_BACKOFF_CAP": "60",
            "REDCRAWL_BACKOFF_JITTER": "0",
            "REDCRAWL_BACKOFF_FORGIVE_AFTER": "3",
            "REDCRAWL_RETRY_AFTER_CAP": "120",
        }
    )
    assert s.backoff_policy == BackoffPolicy(
        base=2.5, cap=60.0, jitter=0.0, forgive_after=3, retry_after_cap=120.0
    )
    assert Settings.from_scrapy({"REDCRAWL_BACKOFF_CAP": 10}).backoff_cap == 10.0


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("REDCRAWL_BACKOFF_BASE", "0", "out of range"),
        ("REDCRAWL_BACKOFF_BASE", "-1", "out of range"),
        ("REDCRAWL_BACKOFF_BASE", "nan", "out of range"),
        ("REDCRAWL_BACKOFF_BASE", "soon", "not a number"),
        ("REDCRAWL_BACKOFF_CAP", "inf", "out of range"),
        ("REDCRAWL_BACKOFF_CAP", str(31 * 86400), "out of range"),
        ("REDCRAWL_BACKOFF_JITTER", "1.5", "out of range"),
        ("REDCRAWL_BACKOFF_JITTER", "-0.1", "out of range"),
        ("REDCRAWL_BACKOFF_FORGIVE_AFTER", "0", "out of range"),
        ("REDCRAWL_BACKOFF_FORGIVE_AFTER", "2.5", "not an integer"),
        ("REDCRAWL_BACKOFF_CAP", "0.5", "below REDCRAWL_BACKOFF_BASE"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(name: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env({name: value})
    assert name in str(err.value) and says in str(err.value)


def test_a_cap_below_the_base_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match="raise the cap or lower the base"):
        Settings(backoff_base=10.0, backoff_cap=5.0)
    assert Settings(backoff_base=10.0, backoff_cap=10.0).backoff_cap == 10.0


# --- stored for the Lua steps, applied by the frontier -----------------------------------


def test_the_frontier_blocks_with_the_configured_backoff(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """base 2 s, cap 5 s, no jitter: blocks of 2, 4, 5, 5 s after failures in a row."""
    f = polite(
        make_frontier,
        politeness_concurrency=1,
        backoff_base=2.0,
        backoff_cap=5.0,
        backoff_jitter=0.0,
    )
    f.push(site("a.test", 10))
    for expected in (2000, 4000, 5000, 5000):
        (lease,) = f.lease("w", 1)
        assert f.defer(lease, "503") == "deferred"
        assert block_ms(f, "a.test", clock) == expected
        clock.advance(expected / 1000)
    conserved(f)


def test_jitter_stays_within_its_fraction(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = polite(
        make_frontier,
        politeness_concurrency=1,
        backoff_base=10.0,
        backoff_cap=10.0,
        backoff_jitter=0.2,
    )
    f.push(site("a.test", 30))
    seen = []
    for _ in range(20):
        (lease,) = f.lease("w", 1)
        f.defer(lease, "429")
        seen.append(block_ms(f, "a.test", clock))
        clock.advance(10.0)
    assert all(8000 <= ms <= 10000 for ms in seen), seen
    assert len(set(seen)) > 1  # random, not always the same


def test_forgive_after_is_applied(make_frontier: FrontierFactory, clock: Clock) -> None:
    f = polite(
        make_frontier,
        politeness_concurrency=1,
        backoff_base=1.0,
        backoff_jitter=0.0,
        backoff_forgive_after=2,
    )
    f.push(site("a.test", 10))
    for _ in range(2):
        (lease,) = f.lease("w", 1)
        f.defer(lease, "503")
        clock.advance(2.0)
    assert failures(f, "a.test") == 2
    for left in (2, 1, 1, 0):
        (lease,) = f.lease("w", 1)
        f.free([(lease, OK)])
        f.ack([lease])
        assert failures(f, "a.test") == left
    conserved(f)


def test_the_latest_worker_sets_the_crawls_backoff_and_others_do_not(
    make_frontier: FrontierFactory, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Live, as the crawl's other politeness defaults: a Scrapy worker stores its values
    (a change is logged) and they count from the key's next failure; a frontier that is
    not a worker (API, CLI, a feeding script) stores them only on a crawl without any."""
    first = polite(make_frontier, politeness_concurrency=1, backoff_base=1.0, backoff_jitter=0)
    first.push(site("a.test", 10))  # stores its backoff: the crawl had none
    stored = json.loads(first.client.hget(first.keys.control, "backoff") or b"")
    assert stored == {"base": 1.0, "cap": 300.0, "jitter": 0.0, "forgive_after": 10}

    tool = polite(make_frontier, politeness_concurrency=1, backoff_base=7.0, backoff_jitter=0)
    tool.push(site("a.test", 1, start=10))  # not a worker: leaves the crawl's value
    assert json.loads(tool.client.hget(tool.keys.control, "backoff") or b"")["base"] == 1.0

    (lease,) = first.lease("w", 1)
    first.defer(lease, "503")
    assert block_ms(first, "a.test", clock) == 1000
    clock.advance(1.0)

    worker = polite(make_frontier, politeness_concurrency=1, backoff_base=3.0, backoff_jitter=0)
    with caplog.at_level(logging.WARNING, logger="redcrawl.frontier.core"):
        worker.store_politeness(worker=True)
    assert "429/503 backoff changes" in caplog.text and "REDCRAWL_BACKOFF_BASE" in caplog.text
    (lease,) = first.lease("w", 1)
    first.defer(lease, "503")  # the second failure in a row, with the new base: 3 * 2
    assert block_ms(first, "a.test", clock) == 6000
    conserved(first)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="redcrawl.frontier.core"):
        worker.store_politeness(worker=True)  # the same values again: nothing to say
    assert "backoff" not in caplog.text


def test_an_unreadable_stored_backoff_means_the_defaults(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """The Lua steps fall back to BackoffPolicy's defaults field by field (a value out of
    range, a field missing, JSON that is not an object)."""
    f = polite(make_frontier, politeness_concurrency=1)
    f.push(site("a.test", 4))
    f.client.hset(f.keys.control, "backoff", json.dumps({"base": -1, "cap": 1e12, "jitter": 0}))
    (lease,) = f.lease("w", 1)
    f.defer(lease, "503")
    assert block_ms(f, "a.test", clock) == 1000  # base 1 s (default), jitter 0 (stored)
    clock.advance(1.0)
    f.client.hset(f.keys.control, "backoff", "[1, 2]")
    (lease,) = f.lease("w", 1)
    f.defer(lease, "503")
    assert 1000 <= block_ms(f, "a.test", clock) <= 2000  # defaults: 2 s, half may go
