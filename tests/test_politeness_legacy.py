"""Crawls created before AutoThrottle's delay moved into the key's state (field ``ad`` of
``rc:{C}:pol:<key>``) may still hold ``auto_delay`` in a key's override JSON
(``rc:{C}:polo``). It is ignored by the lease step, and dropped once per crawl by the
first Scrapy worker to start on it (``FrontierCore.drop_legacy_auto_delay``): it never
expires, and an override hash that exists makes every grant read it."""

from __future__ import annotations

import json
import logging

import pytest

from redcrawl.frontier import FrontierCore

from .conftest import Clock, FrontierFactory
from .test_politeness_frontier import conserved, polite, site

pytestmark = pytest.mark.backends("lists")

OLD = {
    "only.test": {"auto_delay": 3.0},
    "mixed.test": {"auto_delay": 2.0, "crawl_delay": 1.5, "concurrency": 1},
    "operator.test": {"delay": 4.0, "paused": True},
    "array.test": [1, 2],
}


def overrides(f: FrontierCore) -> dict[str, object]:
    raw = f.client.hgetall(f.keys.pol_override)
    return {k.decode(): json.loads(v) for k, v in raw.items() if v != b"not json"}


def old_crawl(make_frontier: FrontierFactory, **settings: object) -> FrontierCore:
    f = polite(make_frontier, **settings)
    f.push(site("only.test", 3))
    f.client.hset(
        f.keys.pol_override,
        mapping={**{k: json.dumps(v) for k, v in OLD.items()}, "bad.test": "not json"},
    )
    return f


def test_auto_delay_is_dropped_and_everything_else_kept(make_frontier: FrontierFactory) -> None:
    f = old_crawl(make_frontier)
    assert f.drop_legacy_auto_delay(batch=2) == 2  # several HSCAN steps
    assert overrides(f) == {
        "mixed.test": {"crawl_delay": 1.5, "concurrency": 1},
        "operator.test": {"delay": 4.0, "paused": True},
        "array.test": [1, 2],
    }
    assert f.client.hget(f.keys.pol_override, "bad.test") == b"not json"
    assert f.drop_legacy_auto_delay() == 0  # again: nothing left to do


def test_the_override_hash_goes_when_only_auto_delay_was_in_it(
    make_frontier: FrontierFactory,
) -> None:
    f = polite(make_frontier)
    f.push(site("a.test", 1))
    f.client.hset(f.keys.pol_override, "a.test", json.dumps({"auto_delay": 1.0}))
    assert f.drop_legacy_auto_delay() == 1
    assert f.client.exists(f.keys.pol_override) == 0  # grants read no override again


def test_the_old_value_never_spaced_grants(make_frontier: FrontierFactory, clock: Clock) -> None:
    """Read: no. The lease step takes AutoThrottle's delay from the state only (a key
    never adjusted is spaced by the start delay, as a new site): an old ``auto_delay``
    of 30 s does not hold the key back, before or after the cleanup."""
    f = old_crawl(make_frontier, politeness_concurrency=1, politeness_start_window=0.0)
    f.client.hset(f.keys.control, "autothrottle", json.dumps({"start_delay": 1.0}))
    f.client.hset(f.keys.pol_override, "only.test", json.dumps({"auto_delay": 30.0}))
    (first,) = f.lease("w", 5)
    f.ack([first])
    clock.advance(1.0)
    (second,) = f.lease("w", 5)  # the start delay, not 30 s
    f.ack([second])
    f.drop_legacy_auto_delay()
    clock.advance(1.0)
    assert len(f.lease("w", 5)) == 1
    conserved(f)


def test_a_worker_drops_it_once_per_crawl(
    make_frontier: FrontierFactory, caplog: pytest.LogCaptureFixture
) -> None:
    f = old_crawl(make_frontier)
    with caplog.at_level(logging.INFO, logger="redcrawl.frontier.core"):
        f.store_politeness(worker=True)
    assert "dropped AutoThrottle's auto_delay from 2 per-site overrides" in caplog.text
    assert f.client.hget(f.keys.control, "auto_delay_dropped") == b"2"
    assert "only.test" not in overrides(f)
    # later workers do not scan again: a value written since (by nothing in this version)
    # stays until an operator drops it
    f.client.hset(f.keys.pol_override, "late.test", json.dumps({"auto_delay": 1.0}))
    make_frontier().store_politeness(worker=True)
    assert "late.test" in overrides(f)


def test_a_new_crawl_is_marked_clean_at_the_first_worker(make_frontier: FrontierFactory) -> None:
    f = polite(make_frontier)
    f.store_politeness(worker=True)
    assert f.client.hget(f.keys.control, "auto_delay_dropped") == b"0"


def test_nothing_without_politeness(make_frontier: FrontierFactory) -> None:
    f = make_frontier(politeness=False)
    assert f.politeness is None
    assert f.drop_legacy_auto_delay() == 0
