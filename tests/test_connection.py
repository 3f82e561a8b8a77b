"""connect(), URL redaction, ACL auth, the embedded Redis, and surviving a Redis outage."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.exceptions
import redis.retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from redcrawl import connection
from redcrawl import embedded as embedded_mod
from redcrawl.codec import Envelope
from redcrawl.connection import EmbeddedRedis, connect, redact, redis_server_binary
from redcrawl.errors import ConfigError, ConnectionLost, RedcrawlError, RedisUnavailable
from redcrawl.frontier import ListsFrontier
from redcrawl.settings import Settings

from .conftest import RedisServer, _free_port, redis_binary


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


# --- connect() ---------------------------------------------------------------------------


def test_connect_to_test_server(redis_server: RedisServer) -> None:
    client = connect(Settings(redis_url=redis_server.url))
    try:
        assert client.ping()
        client.set("rc-test-key", b"\x00\xff")
        assert client.get("rc-test-key") == b"\x00\xff"  # binary-safe, no decoding
        assert client.info("server")["redis_version"] == redis_server.version
    finally:
        client.delete("rc-test-key")
        client.close()


def test_connect_url_argument_overrides_settings(redis7: RedisServer) -> None:
    client = connect(Settings(redis_url="redis://127.0.0.1:1/0"), url=redis7.url)
    assert client.ping()
    client.close()


def test_redis_params_reach_the_client(redis7: RedisServer) -> None:
    client = connect(Settings(redis_url=redis7.url, redis_params={"decode_responses": True}))
    try:
        client.set("rc-params", "v")
        assert client.get("rc-params") == "v"
    finally:
        client.delete("rc-params")
        client.close()


def test_closed_port_is_redis_unavailable_naming_the_url() -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0"
    with pytest.raises(RedisUnavailable) as info:
        connect(Settings(redis_url=url))
    assert url in str(info.value)
    assert info.value.url == url
    assert isinstance(info.value, RedcrawlError)
    assert not isinstance(info.value, redis.exceptions.RedisError)


def test_check_false_does_not_touch_the_server() -> None:
    client = connect(Settings(redis_url=f"redis://127.0.0.1:{_free_port()}/0"), check=False)
    assert isinstance(client, redis.Redis)
    client.close()


def test_password_is_redacted_in_the_error() -> None:
    port = _free_port()
    url = f"redis://user:secret@127.0.0.1:{port}/0"
    with pytest.raises(RedisUnavailable) as info:
        connect(Settings(redis_url=url))
    assert "secret" not in str(info.value)
    assert f"redis://user:***@127.0.0.1:{port}/0" in str(info.value)
    assert "secret" not in info.value.url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://user:secret@h:1/0", "redis://user:***@h:1/0"),
        ("redis://:secret@h/2", "redis://:***@h/2"),
        ("rediss://u:p%40ss@h:6380", "rediss://u:***@h:6380"),
        ("redis://h:1/0", "redis://h:1/0"),
        ("redis://user@h:1/0", "redis://user@h:1/0"),
        ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
    ],
)
def test_redact(url: str, expected: str) -> None:
    assert redact(url) == expected


def test_password_in_query_string_is_redacted() -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0?password=secret"
    with pytest.raises(RedisUnavailable) as info:
        connect(Settings(redis_url=url))
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("url", ["http://x", "ftp://127.0.0.1/", "127.0.0.1:6379"])
def test_malformed_url_is_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="REDCRAWL_REDIS_URL"):
        connect(Settings(redis_url=url))


def test_malformed_port_with_password_is_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        connect(Settings(redis_url="redis://user:secret@127.0.0.1:99999/0"))
    assert "secret" not in str(info.value)


def test_acl_user_password(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    user = "rc_acl_user"
    redis7_client.execute_command(
        "ACL", "SETUSER", user, "reset", "on", ">s3cret-pass", "~*", "&*", "+@all"
    )
    try:
        good = redis7.url.replace("redis://", f"redis://{user}:s3cret-pass@")
        client = connect(Settings(redis_url=good))
        try:
            assert client.acl_whoami() == user
            client.set("acl-key", "1")
            assert redis7_client.get("acl-key") == b"1"
        finally:
            client.close()

        bad = redis7.url.replace("redis://", f"redis://{user}:wrong-pass@")
        with pytest.raises(RedisUnavailable, match="authentication") as info:
            connect(Settings(redis_url=bad))
        assert "wrong-pass" not in str(info.value)
        assert f"{user}:***@" in str(info.value)
    finally:
        redis7_client.execute_command("ACL", "DELUSER", user)


# --- embedded Redis ---------------------------------------------------------------------


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[EmbeddedRedis]]:
    """Collects EmbeddedRedis objects and stops them (and any started server) at the end."""
    # stop() waits in redis-py's retry backoff (test_embedded_stop_is_prompt): skip the waits.
    monkeypatch.setattr(redis.retry, "sleep", lambda s: None)
    servers: list[EmbeddedRedis] = []
    yield servers
    for server in servers:
        server.stop()


def test_redis_server_binary_is_executable() -> None:
    assert os.access(redis_server_binary(), os.X_OK)


def test_embedded_start_and_reuse(tmp_path: Path, embedded: list[EmbeddedRedis]) -> None:
    first = EmbeddedRedis(tmp_path / "rc")
    embedded.append(first)
    url = first.start()
    assert url == f"unix://{tmp_path / 'rc' / 'redis.sock'}"
    assert first.proc is not None and first.proc.poll() is None
    client = redis.Redis.from_url(url)
    config = client.config_get("appendonly")
    assert config == {"appendonly": "yes"}
    client.set("k", "v")

    second = EmbeddedRedis(tmp_path / "rc")
    embedded.append(second)
    assert second.start() == url
    assert second.proc is None  # no second process
    assert redis.Redis.from_url(second.url).get("k") == b"v"
    second.stop()  # not its server: stays up
    assert first.proc.poll() is None and client.ping()
    client.close()


def test_embedded_start_and_stop_log_no_failed_operation(
    tmp_path: Path, embedded: list[EmbeddedRedis], caplog: pytest.LogCaptureFixture
) -> None:
    """At Scrapy's default log level (DEBUG) every worker logged redis-py's "Operation
    failed, with connection: ... details: not connected" twice: the probes before the
    server listens, and the SHUTDOWN that the server answers by closing. Both expected,
    neither a failure: not logged."""
    caplog.set_level(logging.DEBUG)
    (tmp_path / "rc").mkdir()
    (tmp_path / "rc" / "redis.sock").touch()  # a stale socket file: probed, refused
    server = EmbeddedRedis(tmp_path / "rc")
    embedded.append(server)
    server.start()
    server.stop()
    failed = [r.getMessage() for r in caplog.records if "Operation failed" in r.getMessage()]
    assert failed == [], failed


def test_embedded_data_persists_across_stop_and_start(
    tmp_path: Path, embedded: list[EmbeddedRedis]
) -> None:
    server = EmbeddedRedis(tmp_path)
    embedded.append(server)
    client = redis.Redis.from_url(server.start())
    client.rpush("queue", b"a\x00", b"b")
    client.close()
    proc = server.proc
    server.stop()
    assert proc is not None and proc.returncode is not None
    assert not server._alive()

    again = EmbeddedRedis(tmp_path)
    embedded.append(again)
    client = redis.Redis.from_url(again.start())
    assert again.proc is not None and again.proc.pid != proc.pid
    assert client.lrange("queue", 0, -1) == [b"a\x00", b"b"]
    client.close()


def test_embedded_restarts_after_a_crash(tmp_path: Path, embedded: list[EmbeddedRedis]) -> None:
    server = EmbeddedRedis(tmp_path)
    embedded.append(server)
    client = redis.Redis.from_url(server.start())
    client.config_set("appendfsync", "always")
    client.set("survivor", "yes")
    client.close()
    assert server.proc is not None
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    assert server.socket.exists()  # stale socket left behind

    again = EmbeddedRedis(tmp_path)
    embedded.append(again)
    client = redis.Redis.from_url(again.start())
    assert again.proc is not None
    assert client.get("survivor") == b"yes"
    client.close()


def test_resolve_url_without_url_starts_embedded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_mod, "_embedded", {})
    monkeypatch.setattr(redis.retry, "sleep", lambda s: None)  # see test_embedded_stop_is_prompt
    directory = tmp_path / "emb"
    try:
        url = connection.resolve_url(Settings(embedded_dir=directory))
        assert url == f"unix://{directory / 'redis.sock'}"
        server = embedded_mod._embedded[directory.resolve()]
        assert server.proc is not None and server.proc.poll() is None
        # A second call in the same process reuses the same server object and process.
        assert connection.resolve_url(Settings(embedded_dir=directory)) == url
        assert embedded_mod._embedded == {directory.resolve(): server}
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()
        # A configured URL never starts anything.
        assert (
            connection.resolve_url(
                Settings(redis_url="redis://h:1", embedded_dir=tmp_path / "unused")
            )
            == "redis://h:1"
        )
        assert not (tmp_path / "unused").exists()
    finally:
        for server in embedded_mod._embedded.values():
            server.stop()


def test_connect_without_url_starts_embedded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_mod, "_embedded", {})
    monkeypatch.setattr(redis.retry, "sleep", lambda s: None)  # see test_embedded_stop_is_prompt
    directory = tmp_path / "emb"
    try:
        client = connect(Settings(embedded_dir=directory))
        server = embedded_mod._embedded[directory.resolve()]
        assert server.proc is not None and server.proc.poll() is None
        assert client.ping()
        assert client.connection_pool.connection_kwargs["path"] == str(directory / "redis.sock")
        client.set("x", "1")
        other = connect(Settings(embedded_dir=directory))
        assert embedded_mod._embedded == {directory.resolve(): server}
        assert other.get("x") == b"1"
        other.close()
        client.close()
    finally:
        for server in embedded_mod._embedded.values():
            server.stop()


def test_embedded_stop_is_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backoffs: list[float] = []
    monkeypatch.setattr(redis.retry, "sleep", backoffs.append)  # record instead of sleeping
    server = EmbeddedRedis(tmp_path)
    server.start()
    proc = server.proc
    server.stop()
    assert proc is not None and proc.returncode is not None
    assert backoffs == []


def test_embedded_long_directory_path(tmp_path: Path, embedded: list[EmbeddedRedis]) -> None:
    directory = tmp_path / ("d" * 60) / ("e" * 60)
    assert len(str(directory)) > 100
    server = EmbeddedRedis(directory)
    embedded.append(server)
    url = server.start()
    assert len(str(server.socket)) < 100
    assert server.socket.parent != directory
    client = redis.Redis.from_url(url)
    client.set("long", "ok")
    assert client.config_get("dir")["dir"] == str(directory.resolve())
    client.close()

    second = EmbeddedRedis(directory)
    embedded.append(second)
    assert second.start() == url and second.proc is None
    client = redis.Redis.from_url(second.url)
    assert client.get("long") == b"ok"
    client.close()


def test_embedded_bad_binary_is_redis_unavailable(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, binary="/bin/false")
    with pytest.raises(RedisUnavailable, match="did not start"):
        server.start(timeout=5)
    assert server.proc is None


# --- outages ---------------------------------------------------------------------------


def _spawn(binary: str, port: int, directory: Path) -> subprocess.Popen[bytes]:
    """A server on ``port`` with every write fsynced to its AOF (restartable on its data)."""
    server = RedisServer(binary, directory, port=port, persistence="aof", appendfsync="always")
    assert server.proc is not None
    return server.proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture(params=["7", "6.2"])
def binary(request: pytest.FixtureRequest) -> str:
    return redis_binary(str(request.param))


def test_brief_outage_blocks_retries_and_loses_nothing(binary: str, tmp_path: Path) -> None:
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    procs = [_spawn(binary, port, tmp_path)]
    restarted = threading.Event()
    try:
        client = connect(Settings(redis_url=url))
        frontier = ListsFrontier(client, Settings(), "c")
        before = [env(f"http://example.com/{i}") for i in range(5)]
        assert frontier.push(before).accepted == 5

        procs[0].send_signal(signal.SIGKILL)  # no shutdown: only the fsynced AOF survives
        procs[0].wait()
        with pytest.raises(OSError):  # the server is really gone
            socket.create_connection(("127.0.0.1", port), timeout=1).close()

        def restart() -> None:
            time.sleep(1.0)
            restarted.set()
            procs.append(_spawn(binary, port, tmp_path))

        thread = threading.Thread(target=restart)
        thread.start()
        try:
            result = frontier.push([env("http://example.com/during-outage")])
        finally:
            thread.join()
        assert restarted.is_set()  # the call could only succeed on the new server
        assert len(procs) == 2
        assert result.accepted == 1

        counts = frontier.counts()
        assert counts.accepted == 6 and counts.ready == 6
        leased = frontier.lease("w", 10)
        assert sorted(lease.envelope.url for lease in leased) == sorted(
            [e.url for e in before] + ["http://example.com/during-outage"]
        )
        # Dedupe state survived too.
        assert frontier.push(before).accepted == 0
        client.close()
    finally:
        for proc in procs:
            _kill(proc)


def test_server_gone_for_good_is_connection_lost(binary: str, tmp_path: Path) -> None:
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = _spawn(binary, port, tmp_path)
    try:
        client = connect(
            Settings(redis_url=url), retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 2)
        )
        frontier = ListsFrontier(client, Settings(), "c")
        assert frontier.push([env("http://example.com/1")]).accepted == 1
    finally:
        _kill(proc)

    for call in (
        frontier.counts,
        lambda: frontier.push([env("http://example.com/2")]),
        lambda: frontier.lease("w", 1),
    ):
        with pytest.raises(ConnectionLost) as info:
            call()
        assert not isinstance(info.value, redis.exceptions.RedisError)
        assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
    client.close()


# --- the embedded Redis shared by several processes -------------------------------------


class User:
    """A real process using the embedded Redis of a folder (tests/embedded_user.py)."""

    def __init__(self, directory: Path) -> None:
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.embedded_user", str(directory)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.server_pid = int(self.expect("ready")[0])

    def expect(self, word: str) -> list[str]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != word:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"expected {word!r}, got {line!r}; stderr:\n{err}")
        return line[1:]

    def send(self, command: str, answer: str) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect(answer)

    def exit(self) -> str:
        """Ask the process to return normally; its stderr (logs) once it has exited."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("exit\n")
        self.proc.stdin.flush()
        _, err = self.proc.communicate(timeout=60)  # a hang guard, not a timing assert
        assert self.proc.returncode == 0, err
        return err

    def sigkill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        assert self.proc.returncode == -signal.SIGKILL

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()  # closes the pipes


def _process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its parent counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not _process_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def users(tmp_path: Path) -> Iterator[list[User]]:
    """Collects User processes; at the end kills what is left, and any server they left."""
    started: list[User] = []
    yield started
    pids = {u.server_pid for u in started}
    for user in started:
        user.cleanup()
    for pid in pids:
        if not _process_gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_embedded_outlives_the_first_process_to_exit(tmp_path: Path, users: list[User]) -> None:
    first = User(tmp_path)
    users.append(first)
    second = User(tmp_path)
    users.append(second)
    assert second.server_pid == first.server_pid  # one server, shared
    assert first.send("push 5", "pushed") == ["5"]

    err = first.exit()  # as `scrapy crawl` ends: atexit hooks run
    assert "Traceback" not in err
    assert not _process_gone(first.server_pid)  # still serving the second process
    assert second.send("push 3", "pushed") == ["3"]
    assert second.send("counts", "counts") == ["8", "8"]

    err = second.exit()  # the last user leaves: the server is shut down cleanly
    assert "Traceback" not in err
    assert _wait_gone(first.server_pid)
    assert not EmbeddedRedis(tmp_path)._alive()

    third = User(tmp_path)  # a new process finds the data again (AOF)
    users.append(third)
    assert third.server_pid != first.server_pid
    assert third.send("counts", "counts") == ["8", "8"]
    third.exit()
    assert _wait_gone(third.server_pid)


def test_a_sigkilled_user_does_not_keep_the_embedded_alive(
    tmp_path: Path, users: list[User]
) -> None:
    starter = User(tmp_path)  # starts the server (its parent)
    users.append(starter)
    other = User(tmp_path)
    users.append(other)
    starter.sigkill()  # no atexit, no goodbye: its claim must not count any more
    assert other.send("push 2", "pushed") == ["2"]
    other.exit()  # the only live user leaves
    assert _wait_gone(other.server_pid)


def test_embedded_left_by_a_sigkilled_last_user_is_stopped_by_the_next(
    tmp_path: Path, users: list[User]
) -> None:
    only = User(tmp_path)
    users.append(only)
    assert only.send("push 4", "pushed") == ["4"]
    only.sigkill()
    assert not _process_gone(only.server_pid)  # nobody was there to stop it
    nxt = User(tmp_path)
    users.append(nxt)
    assert nxt.server_pid == only.server_pid  # reused, not a second server on the folder
    assert nxt.send("counts", "counts") == ["4", "4"]
    nxt.exit()
    assert _wait_gone(only.server_pid)


def test_stop_embedded(tmp_path: Path, users: list[User]) -> None:
    settings = Settings(embedded_dir=tmp_path)
    assert connection.stop_embedded(settings) is False  # nothing running
    user = User(tmp_path)
    users.append(user)
    with pytest.raises(RedcrawlError, match=rf"in use by 1 process \(pid {user.proc.pid}\)"):
        connection.stop_embedded(settings)
    assert user.send("push 1", "pushed") == ["1"]
    user.sigkill()
    assert not _process_gone(user.server_pid)  # orphaned
    assert connection.stop_embedded(settings) is True
    assert _process_gone(user.server_pid) and not EmbeddedRedis(tmp_path)._alive()

    again = User(tmp_path)  # data kept (SHUTDOWN flushes the AOF)
    users.append(again)
    assert again.send("counts", "counts") == ["1", "1"]
    assert connection.stop_embedded(settings, force=True) is True
    assert _wait_gone(again.server_pid)


def test_embedded_socket_is_logged_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(embedded_mod, "_embedded", {})
    monkeypatch.setattr(embedded_mod, "_announced", set())
    monkeypatch.setattr(redis.retry, "sleep", lambda s: None)
    directory = tmp_path / "emb"
    settings = Settings(embedded_dir=directory)
    sock = directory.resolve() / "redis.sock"
    caplog.set_level(logging.INFO, logger="redcrawl.embedded")
    try:
        connect(settings).close()
        connect(settings).close()
        other = EmbeddedRedis(directory)  # another user in this process: no second line
        other.start()
        other.stop()
    finally:
        for server in embedded_mod._embedded.values():
            server.stop()
    lines = [r.getMessage() for r in caplog.records if str(sock) in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"redis-cli -s {sock}" in lines[0]
    assert connection.redis_cli_hint(settings) == f"redis-cli -s {sock}"
    assert connection.redis_cli_hint(Settings(redis_url="redis://u:secret@h:1/2")) == (
        "redis-cli -u 'redis://u:***@h:1/2'"
    )
    spaced = Settings(embedded_dir=tmp_path / "a b")
    assert connection.redis_cli_hint(spaced) == (
        f"redis-cli -s '{(tmp_path / 'a b').resolve() / 'redis.sock'}'"
    )
    assert not (tmp_path / "a b").exists()  # the hint never starts anything


# --- scrapy-redis's REDIS_HOST / REDIS_PORT / REDIS_DB (issue 10 item 6) ----------------


def test_redis_port_alone_connects_to_localhost(redis7: RedisServer, tmp_path: Path) -> None:
    settings = Settings.from_mapping(
        {"REDIS_PORT": redis7.port, "REDCRAWL_EMBEDDED_DIR": str(tmp_path / "no")}
    )
    client = connect(settings)  # scrapy-redis: localhost:REDIS_PORT; no embedded server
    try:
        assert int(client.info("server")["tcp_port"]) == redis7.port
    finally:
        client.close()
    assert not (tmp_path / "no").exists()


def test_redis_db_selects_the_database(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    bare = f"redis://127.0.0.1:{redis7.port}"
    for values in (
        {"REDIS_URL": bare, "REDIS_DB": 3},
        {"REDIS_PORT": redis7.port, "REDIS_DB": "3"},
        {"REDIS_PARAMS": {"port": redis7.port, "db": 3}},
    ):
        client = connect(Settings.from_mapping(values))
        try:
            client.set("rc-db-probe", "3")
            assert client.connection_pool.connection_kwargs["db"] == 3
            assert redis7_client.get("rc-db-probe") is None  # not in db 0
            client.delete("rc-db-probe")
        finally:
            client.close()
    # a URL naming its database wins over REDIS_DB, as in scrapy-redis (redis-py's rule)
    client = connect(Settings.from_mapping({"REDIS_URL": bare + "/4", "REDIS_DB": 3}))
    assert client.connection_pool.connection_kwargs["db"] == 4
    client.close()


@pytest.mark.slow
def test_two_scrapy_crawls_share_the_embedded_redis(tmp_path: Path) -> None:
    """The issue's case: two `scrapy crawl` workers on the embedded Redis (no URL). The one
    that started the server exits first; the other keeps crawling and closes cleanly."""
    from redcrawl.demo.site import ShopSite, SiteConfig
    from redcrawl.scrapy.scheduler import seed

    from .scrapy_projects.harness import start_spider

    def wait_for(check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 60  # a hang guard, not a timing assert
        while not check():
            assert time.monotonic() < deadline, f"gave up waiting for {what}"
            time.sleep(0.1)

    server = EmbeddedRedis(tmp_path / ".redcrawl")
    config = SiteConfig(products=60, slow_every=60, slow_delay=2, tracking_params=False)
    with ShopSite(config) as site:
        # A starts the embedded server and stays up through its slow page
        a = start_spider(
            "fanout_spider.py",
            tmp_path,
            redis_url="",
            crawl="a",
            tag="a",
            args={"url": site.url, "leaves": 3},
        )
        with a:
            wait_for(lambda: site.hits().get("/product/60", 0) > 0, "A's slow page")
            # B has no start URL and would wait a long time for work
            b = start_spider(
                "fanout_spider.py",
                tmp_path,
                redis_url="",
                crawl="b",
                tag="b",
                args={"url": site.url, "start": "0"},
                settings={"REDCRAWL_IDLE_BEFORE_CLOSE": 600, "REDCRAWL_POLL_INTERVAL": 0.1},
            )
            with b:
                probe = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
                frontier_b = ListsFrontier(probe, Settings(), "b")
                wait_for(lambda: server._alive() and bool(frontier_b.workers()), "B to start")
                run_a = a.wait().ok()
                assert "Traceback" not in run_a.stderr
                assert b.proc.poll() is None  # B is still there, waiting for work
                # B keeps using the server: it fetches what arrives after A left
                urls = [f"{site.url}/product/{i}" for i in (10, 11, 12)]
                seed(urls, settings=Settings(), crawl="b", client=probe, callback="parse_leaf")
                wait_for(lambda: frontier_b.counts().done == 3, "B to fetch the new pages")
                probe.close()
                b.proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean close, now
                run_b = b.wait(timeout=60)
    assert run_b.returncode == 0, run_b.tail()
    assert "Traceback" not in run_b.stderr, run_b.tail()
    assert sorted(run_b.urls) == sorted(urls)
    pid_file = tmp_path / ".redcrawl" / "redis.pid"
    assert not server._alive() and not pid_file.exists()  # the last user stopped it
