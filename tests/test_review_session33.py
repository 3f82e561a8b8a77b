"""Review of 8c28b8a..9ad7b47 (session 33): regressions and holes, each a failing test
first (real redis-server, no mocks)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from redcrawl.connection import connect, redact
from redcrawl.embedded import EmbeddedRedis
from redcrawl.errors import ConfigError
from redcrawl.redis_server import LocalCluster
from redcrawl.settings import Settings

from .apikit import READ, ApiServer, api_settings

READ_AUTH = {"Authorization": f"Bearer {READ}"}

SECRET = "s3cretpw"


# --- a password that is digits before its '/' is printed whole --------------------------
@pytest.mark.parametrize(
    "url",
    [
        f"redis://admin:2024/{SECRET}@127.0.0.1:6379/0",
        f"redis+cluster://admin:2024/{SECRET}@127.0.0.1:7000",
    ],
)
def test_password_with_digits_then_slash_is_never_printed(url: str) -> None:
    """``admin:2024/s3cretpw@host``: the part before the '/' (``admin:2024``) reads as a
    host and port, so _userinfo takes it for an address without a user and the password
    goes out in redact() and in the database-path / cluster-database complaint."""
    assert SECRET not in redact(url)
    with pytest.raises(ConfigError) as err:
        if url.startswith("redis+cluster"):
            from redcrawl.cluster import connect_cluster

            connect_cluster(Settings(), url)
        else:
            connect(Settings(), url=url)
    assert SECRET not in str(err.value)


# --- the embedded Redis: two processes on one folder must share one server --------------
@contextlib.contextmanager
def _servers(*embedded: EmbeddedRedis) -> Iterator[None]:
    try:
        yield
    finally:
        for e in reversed(embedded):
            with contextlib.suppress(Exception):
                e.stop()
        for e in embedded:  # (a second server the bug started: not left running)
            proc = e.proc
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def _shared(first: EmbeddedRedis, second: EmbeddedRedis) -> None:
    """Start both; a write through the first user's connection (made before the second
    joined), after the second joined, is seen by the second: one server serves the folder
    (two would write the same AOF directory)."""
    first.start()
    a = redis.Redis(unix_socket_path=str(first.socket))
    a.ping()
    second.start()
    b = redis.Redis(unix_socket_path=str(second.socket))
    try:
        a.set("written-after-join", "1")
        assert b.get("written-after-join") == b"1", (
            f"two redis-servers on {first.directory}: sockets {first.socket} and {second.socket}"
        )
    finally:
        a.close()
        b.close()


def test_embedded_long_folder_shared_with_and_without_xdg_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder whose path is too long for a socket: its socket used to be one name in
    the temporary directory; now it is in XDG_RUNTIME_DIR when that is set. A process
    with it (a login shell) and one without (cron, a systemd service, sudo, docker exec)
    then each start their own redis-server on the same data folder."""
    folder = tmp_path / ("d" * 60) / ("e" * 60)
    folder.mkdir(parents=True)
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    first = EmbeddedRedis(folder)
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    second = EmbeddedRedis(folder)
    with _servers(first, second):
        _shared(first, second)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root (a folder owned by another uid)")
def test_embedded_folder_owned_by_another_uid_as_root(tmp_path: Path) -> None:
    """Root in a container, the project folder bind-mounted from the host (owned by uid
    1000): _alive() trusts no socket in a folder not owned by the current uid, so every
    process that joins unlinks the running server's socket and starts a second
    redis-server on the same AOF directory."""
    folder = tmp_path / "project"
    folder.mkdir()
    os.chown(folder, 1000, 1000)
    folder.chmod(0o755)
    first, second = EmbeddedRedis(folder), EmbeddedRedis(folder)
    with _servers(first, second):
        _shared(first, second)
        servers = subprocess.run(
            ["pgrep", "-f", f"unixsocket:{first.socket}"], capture_output=True, text=True
        ).stdout.split()
        assert len(servers) == 1, servers


# --- /v1/ready on a cluster, as a user that may not run CLUSTER INFO --------------------
def test_ready_on_a_cluster_as_a_user_without_cluster_info(redis_cluster: LocalCluster) -> None:
    """connect_cluster takes a refused CLUSTER INFO (an ACL user without it) for "ok";
    /v1/ready now asks every master's cluster_state and lets the NOPERM out as a
    FrontierError: the probe never says ready while every crawl call works."""
    user, password = "rev33", "rev33-password-long-enough"
    rule = ["on", f">{password}", "~*", "&*", "+@all", "-cluster|info"]
    for node in redis_cluster.nodes:
        with node.client() as c:
            c.acl_setuser(user, reset=True)
            c.execute_command("ACL", "SETUSER", user, *rule)
    url = redis_cluster.url.replace("://", f"://{user}:{password}@", 1)
    client = connect(Settings(redis_url=url))
    api = ApiServer(api_settings(url), client)
    try:
        assert httpx.get(f"{api.url}/v1/crawls", timeout=30, headers=READ_AUTH).status_code == 200
        got = httpx.get(f"{api.url}/v1/ready", timeout=30)
        assert got.status_code == 200, got.text
    finally:
        api.stop()
        client.close()
        for node in redis_cluster.nodes:
            with node.client() as c:
                c.acl_deluser(user)


# --- an IPv6 link-local address with its zone, and an '@' after it --------------------
@pytest.mark.parametrize(
    "url",
    [
        "redis://[fe80::1%25eth0]:6379/0?client_name=crawler@host1",
        "rediss://[fe80::1%25eth0]:6380/0?ssl_ca_certs=/etc/ssl/ca@corp.pem",
    ],
)
def test_ipv6_zone_with_an_at_sign_later_is_not_taken_for_a_password(url: str) -> None:
    """_HOSTS has no room for a zone id ('%25eth0') in an IPv6 literal, so such an address
    followed by any '@' (a client name, a CA file's path, a password in the query) is
    refused as "its user or password holds '/'", and redact() prints only what follows
    the last '@'."""
    assert "fe80::1" in redact(url)
    client = connect(Settings(), url=url, check=False)
    client.close()


# --- docs: REDCRAWL_API_ALLOWED_HOSTS beyond loopback now needs tokens ------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("name", ["crawler.example.com", "*"])
def test_docs_say_an_open_api_refuses_allowed_hosts_beyond_loopback(name: str) -> None:
    """check_bind now refuses an open (no token) API with a non-loopback name or '*' in
    REDCRAWL_API_ALLOWED_HOSTS, but the setting's description ("`*`: any", "the name
    clients use behind a proxy") and docs/api.md's Host section ("Behind a reverse proxy
    that passes the public name, list that name") still offer it without a word about
    tokens: whoever follows them gets a start-up refusal."""
    from redcrawl.api import check_bind

    with pytest.raises(ConfigError, match="REDCRAWL_API_ALLOWED_HOSTS"):
        check_bind(Settings(api_host="127.0.0.1", api_allowed_hosts=(name,)))
    row = next(
        line
        for line in (DOCS / "settings.md").read_text().splitlines()
        if line.startswith("| `REDCRAWL_API_ALLOWED_HOSTS`")
    )
    assert "token" in row.lower(), row
    api = (DOCS / "api.md").read_text()
    proxy = api.index("Behind a reverse proxy that passes the public name")
    assert "token" in api[proxy : proxy + 300].lower(), api[proxy : proxy + 300]
