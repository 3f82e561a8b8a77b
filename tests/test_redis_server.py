"""The one helper that starts throwaway redis-servers (redcrawl.redis_server), used by the
embedded connection, the test fixtures and the benches."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import redis

from redcrawl.redis_server import RedisServer, find_binary, server_version

from .conftest import redis_binary


@pytest.fixture(params=["7", "6.2"])
def binary(request: pytest.FixtureRequest) -> str:
    return redis_binary(str(request.param))


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.02)
    return False


def test_find_binary_by_version(binary: str) -> None:
    version = server_version(binary)
    assert version[0].isdigit()
    major_minor = ".".join(version.split(".")[:2])
    found = find_binary(major_minor)
    assert found is not None and server_version(found).startswith(major_minor + ".")
    assert find_binary("99") is None
    assert find_binary() is not None


def test_a_throwaway_server_has_no_persistence_and_leaves_nothing(binary: str) -> None:
    server = RedisServer(binary)
    directory, pid = server.directory, server.pid
    with server.client() as client:
        assert client.ping()
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert client.config_get("save") == {"save": ""}
    assert server.version == server_version(binary)
    assert redis.Redis.from_url(server.url).ping()
    server.stop()
    server.stop()  # harmless again
    assert _gone(pid)
    assert not directory.exists()


def test_unix_socket_and_extra_arguments(binary: str, tmp_path: Path) -> None:
    sock = tmp_path / "r.sock"
    with RedisServer(
        binary, tmp_path, unix_socket=sock, extra=["--maxmemory", "12345678"]
    ) as server:
        assert server.url == f"unix://{sock}"
        assert server.port == 0
        with redis.Redis.from_url(server.url) as client:
            assert client.config_get("maxmemory") == {"maxmemory": "12345678"}
    assert tmp_path.exists()  # a folder it was given is left alone


@pytest.mark.parametrize("persistence", ["aof", "rdb"])
def test_restart_on_the_same_port_keeps_the_data(
    binary: str, tmp_path: Path, persistence: str
) -> None:
    with RedisServer(
        binary, tmp_path, persistence="aof" if persistence == "aof" else "rdb", appendfsync="always"
    ) as server:
        port = server.port
        with server.client() as client:
            client.set("k", "v")
        server.restart(save=True if persistence == "rdb" else None)
        assert server.port == port
        with server.client() as client:
            assert client.get("k") == b"v"


def test_daemonized_server_is_stopped_by_its_pid(binary: str, tmp_path: Path) -> None:
    server = RedisServer(binary, tmp_path, daemonize=True)
    try:
        assert server.proc is None  # not our child: the daemon detached
        pid = server.pid
        assert server.client().ping()
    finally:
        server.stop()
    assert _gone(pid)


def test_a_server_that_does_not_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="did not start"):
        RedisServer("/bin/false", tmp_path, timeout=5)


def test_a_missing_part_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    from . import conftest

    monkeypatch.setattr(conftest, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="redis-server 99 is missing"):
        conftest.redis_binary("99")
    monkeypatch.setattr(conftest, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI must provide it"):
        conftest.redis_binary("99")
    with pytest.raises(pytest.fail.Exception, match="no_such_module is missing"):
        conftest.need_module("no_such_module", "pip install it")


def test_a_port_another_server_holds_is_an_error_not_a_shared_server(
    binary: str, tmp_path: Path
) -> None:
    """Under pytest-xdist a port picked free can be bound by another worker's server first:
    ours then fails to bind, and the other one answers PING on the port. Seen as ready,
    two workers' tests shared a server (one's FLUSHALL emptied the other's filter: 95,063
    of 100,000 Bloom entries left). It must be an error (the fixtures then try a new port)."""
    with RedisServer(binary) as first:
        with pytest.raises(RuntimeError, match="did not start"):
            RedisServer(binary, tmp_path / "child", port=first.port, timeout=5)
        with pytest.raises(RuntimeError, match="did not start"):
            RedisServer(binary, tmp_path / "daemon", port=first.port, daemonize=True, timeout=5)
        with first.client() as client:
            assert client.ping()  # the first one untouched
