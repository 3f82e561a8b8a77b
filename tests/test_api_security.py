"""The API's perimeter (issue 11, items 1-2): the token is checked before a body is read,
big bodies are parsed off the event loop, and without tokens foreign web pages (a foreign
``Origin``, DNS rebinding through the ``Host`` header) cannot steer it. Real uvicorn, real
Redis 7; the measurement runs ``redcrawl serve`` in its own process."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from redcrawl.api import check_bind
from redcrawl.settings import Settings

from .apikit import ADMIN, AUTH_READ, SRC, ApiServer, api_settings, serving
from .conftest import RedisServer, _free_port

STATE_CHANGING = [
    ("POST", "/v1/crawls/c/requests"),
    ("POST", "/v1/crawls/c/dead/requeue"),
    ("POST", "/v1/crawls/c/workers/w/reclaim"),
    ("POST", "/v1/crawls/c/pause"),
    ("POST", "/v1/crawls/c/resume"),
    ("DELETE", "/v1/crawls/c"),
]
SUBMIT = {"requests": [{"url": "https://example.com/"}]}


@pytest.fixture
def open_api(redis7: RedisServer, redis7_client: redis.Redis) -> Iterator[ApiServer]:
    """An API without tokens (open, loopback), on a flushed Redis 7 with crawl "c"."""
    server = ApiServer(Settings(redis_url=redis7.url), redis7_client)
    httpx.post(f"{server.url}/v1/crawls/c/requests", json=SUBMIT).raise_for_status()
    yield server
    server.stop()


@pytest.fixture
def token_api(redis7: RedisServer, redis7_client: redis.Redis) -> Iterator[ApiServer]:
    server = ApiServer(api_settings(redis7.url), redis7_client)
    yield server
    server.stop()


# --- item 1: the token first ------------------------------------------------------------


def test_malformed_body_with_a_bad_token_is_401(
    token_api: ApiServer, redis7_client: redis.Redis
) -> None:
    """curl -X POST -H 'Authorization: Bearer wrong' -H 'Content-Type: application/json'
    -d '{' .../v1/crawls/x/requests must be 401, not a 422 about the body."""
    for path in ("/v1/crawls/x/requests", "/v1/crawls/x/dead/requeue"):
        for body in (b"{", b"\xff\xfe", b"[" * 5000):
            for auth, status in (
                ({"Authorization": "Bearer wrong"}, 401),
                ({}, 401),
                ({"Authorization": f"Basic {ADMIN}"}, 401),
                (AUTH_READ, 403),
            ):
                r = httpx.post(
                    token_api.url + path,
                    content=body,
                    timeout=10,
                    headers={**auth, "Content-Type": "application/json"},
                )
                assert r.status_code == status, (path, body[:5], auth, r.text)
                assert "token" in r.json()["detail"]
    assert redis7_client.dbsize() == 0


def _post_head(port: int, path: str, token: str, length: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
    )
    return sock


def _status(sock: socket.socket) -> int:
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return int(head.split(b" ", 2)[1])


def test_unauthenticated_body_is_never_waited_for(token_api: ApiServer) -> None:
    """A 15 MiB POST with a wrong token is answered 401 after its first 64 KiB: the server
    does not wait for (or read, or parse) the rest."""
    port = int(token_api.url.rsplit(":", 1)[1])
    length = 15 * 1024 * 1024
    sock = _post_head(port, "/v1/crawls/x/requests", "wrong", length)
    try:
        sock.sendall(b'{"requests": [' + b" " * 65536)
        assert _status(sock) == 401  # before the fix: a recv timeout (waiting for the body)
    finally:
        sock.close()


def _big_body() -> bytes:
    """About 15 MiB of valid JSON that costs seconds to validate."""
    items = [
        {"url": f"https://example.com/{i}", "meta": {"k": list(range(2800))}} for i in range(1000)
    ]
    return json.dumps({"requests": items}).encode()


@pytest.fixture
def serve_process(redis7: RedisServer, tmp_path: Path) -> Iterator[str]:
    """`redcrawl serve` with tokens, in its own process: its event loop is measured."""
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "REDCRAWL_REDIS_URL": redis7.url,
        "REDCRAWL_API_PORT": str(port),
        "REDCRAWL_API_ADMIN_TOKENS": ADMIN,
        "REDCRAWL_API_MAX_BATCH": "1000",
    }
    url = f"http://127.0.0.1:{port}"
    with serving(tmp_path, env, f"{url}/v1/health"):
        yield url


def _health_while(url: str, posts: list[threading.Thread]) -> tuple[list[float], int]:
    """Health latencies measured while ``posts`` run; how many were answered while at
    least one post was still running."""
    for t in posts:
        t.start()
    latencies: list[float] = []
    during = 0
    with httpx.Client(timeout=60) as c:
        while any(t.is_alive() for t in posts):
            t0 = time.perf_counter()
            assert c.get(f"{url}/v1/health").status_code == 200
            latencies.append(time.perf_counter() - t0)
            during += any(t.is_alive() for t in posts)
            time.sleep(0.02)
    for t in posts:
        t.join(120)
    return latencies, during


def test_health_stays_answered_while_big_posts_arrive(
    serve_process: str, redis7_client: redis.Redis
) -> None:
    url = serve_process
    body = _big_body()
    statuses: list[int] = []

    def post(token: str) -> None:
        r = httpx.post(
            f"{url}/v1/crawls/big/requests",
            content=body,
            timeout=120,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        statuses.append(r.status_code)

    for token, expected in (("wrong", 401), (ADMIN, 200)):
        statuses.clear()
        redis7_client.flushall()
        latencies, during = _health_while(
            url, [threading.Thread(target=post, args=(token,)) for _ in range(3)]
        )
        assert statuses == [expected] * 3, statuses
        print(
            f"\n3 posts of {len(body) / 2**20:.1f} MiB, token {token[:5]}: "
            f"{len(latencies)} health calls ({during} while posts ran), "
            f"max {max(latencies) * 1000:.0f} ms, "
            f"median {sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms"
        )
        assert during >= 1  # answered while the posts were in progress
    assert redis7_client.hget("rc:{big}:stats", "accepted") == b"1000"


# --- item 2: foreign pages --------------------------------------------------------------


def test_foreign_origin_cannot_change_state(
    open_api: ApiServer, redis7_client: redis.Redis
) -> None:
    with httpx.Client(base_url=open_api.url, timeout=10) as c:
        for origin in (
            "http://evil.example",
            "null",
            "http://127.0.0.1:1",
            "https://127.0.0.1" + open_api.url[16:] + ".evil.example",
        ):
            for method, path in STATE_CHANGING:
                r = c.request(
                    method,
                    path,
                    headers={"Origin": origin},
                    json=SUBMIT if path.endswith("/requests") else None,
                )
                assert r.status_code == 403, (origin, method, path, r.text)
                assert "Origin" in r.json()["detail"]
        assert c.get("/v1/crawls/c").json()["paused"] is False  # nothing happened
        assert c.get("/v1/crawls/c").json()["accepted"] == 1
        # reading is harmless (the browser won't show a foreign page the answer)
        assert c.get("/v1/crawls/c", headers={"Origin": "http://evil.example"}).status_code == 200
        # same origin (the API's own /docs page) and no Origin (curl, scripts) are fine
        assert (
            c.post("/v1/crawls/c/pause", headers={"Origin": open_api.url}).json()["paused"] is True
        )
        assert c.post("/v1/crawls/c/resume").json()["paused"] is False


def test_dns_rebinding_host_is_refused(open_api: ApiServer) -> None:
    port = open_api.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=open_api.url, timeout=10) as c:
        for host in (
            f"evil.example:{port}",
            "evil.example",
            f"127.0.0.1.nip.io:{port}",
            f"127.0.0.1:{int(port) + 1}",
            "",
        ):
            for method, path in [("GET", "/v1/crawls"), ("GET", "/v1/health"), *STATE_CHANGING]:
                r = c.request(method, path, headers={"Host": host})
                assert r.status_code == 400, (host, method, path, r.text)
                assert "Host" in r.json()["detail"]
                assert "REDCRAWL_API_ALLOWED_HOSTS" in r.json()["detail"]
        assert c.get("/v1/crawls/c").json()["accepted"] == 1  # nothing was purged
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
            assert c.get("/v1/crawls", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_setting(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    server = ApiServer(
        Settings(redis_url=redis7.url, api_allowed_hosts=("api.internal",)), redis7_client
    )
    port = server.url.rsplit(":", 1)[1]
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.get("/v1/health", headers={"Host": f"api.internal:{port}"}).status_code == 200
            assert c.get("/v1/health", headers={"Host": f"other:{port}"}).status_code == 400
    finally:
        server.stop()


# --- IPv6 literals -------------------------------------------------------------------------


def test_ipv6_literal_host_binds(redis7: RedisServer, tmp_path: Path) -> None:
    """`--host [::1]` passes the loopback check and really serves on ::1."""
    try:
        socket.socket(socket.AF_INET6).close()
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    check_bind(Settings(api_host="[::1]"))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC), "REDCRAWL_REDIS_URL": redis7.url}
    env.pop("REDCRAWL_API_TOKENS", None)
    env.pop("REDCRAWL_API_ADMIN_TOKENS", None)
    with serving(
        tmp_path, env, f"http://[::1]:{port}/v1/health", "--host", "[::1]", "--port", str(port)
    ) as (r, log):
        assert r.json() == {"status": "ok"}
        r = httpx.post(f"http://[::1]:{port}/v1/crawls/v6/requests", json=SUBMIT, timeout=10)
        assert r.status_code == 200, r.text
    text = log.read_text()
    assert text.lower().count("without authentication") == 1, text  # said once


def test_login_cookie_is_secure_behind_a_tls_proxy_on_loopback(serve_process: str) -> None:
    """Behind a TLS-terminating proxy the API is reached over http, so the cookie's
    ``Secure`` flag must come from the proxy's ``X-Forwarded-Proto``: uvicorn trusts it
    from 127.0.0.1 and ::1 (``FORWARDED_ALLOW_IPS`` for a proxy elsewhere, as
    docs/dashboard.md says). A direct http login gets no ``Secure``: the browser would
    never send the cookie back."""
    form = {"token": ADMIN, "next": "/"}
    proxied = httpx.post(
        f"{serve_process}/login", data=form, headers={"X-Forwarded-Proto": "https"}
    )
    direct = httpx.post(f"{serve_process}/login", data=form)
    assert proxied.status_code == direct.status_code == 303
    assert "secure" in proxied.headers["set-cookie"].lower().split("; ")
    assert "secure" not in direct.headers["set-cookie"].lower().split("; ")
