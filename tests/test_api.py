"""The HTTP control plane, end to end: a real uvicorn server on a real Redis (7.x and 6.2),
driven with httpx; requests leased, failed and heartbeated through ListsFrontier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from scrapy import Request
from scrapy.utils.request import fingerprint as scrapy_fingerprint

from redcrawl.api import check_bind, serve
from redcrawl.errors import ConfigError
from redcrawl.frontier import FrontierCore, StreamsFrontier, open_frontier
from redcrawl.scrapy.scheduler import seed
from redcrawl.settings import Settings

from .apikit import (
    ADMIN,
    AUTH_ADMIN,
    AUTH_READ,
    MAX_BATCH,
    SRC,
    ApiServer,
    api_settings,
    serving,
)
from .conftest import RedisServer, SecondsClock, _free_port, redis_binary


@pytest.fixture(scope="module", params=["lists", "streams"])
def api_server(redis_server: RedisServer, request: pytest.FixtureRequest) -> Iterator[ApiServer]:
    """An API with read and admin tokens, per Redis version and per frontier backend (new
    crawls are created with it)."""
    client = redis.Redis.from_url(redis_server.url)
    server = ApiServer(
        api_settings(redis_server.url, backend=request.param), client, clock=SecondsClock()
    )
    yield server
    server.stop()
    client.close()


@pytest.fixture
def api(api_server: ApiServer, redis_client: redis.Redis) -> Iterator[httpx.Client]:
    """An httpx client with the admin token, on a flushed Redis."""
    with httpx.Client(base_url=api_server.url, headers=AUTH_ADMIN, timeout=10) as c:
        yield c


@pytest.fixture
def frontier(api_server: ApiServer, redis_client: redis.Redis) -> FrontierCore:
    """The frontier of crawl "c", as a worker sees it."""
    return open_frontier(redis_client, api_server.settings, "c")


def submit(api: httpx.Client, *items: dict[str, Any], crawl: str = "c") -> httpx.Response:
    return api.post(f"/v1/crawls/{crawl}/requests", json={"requests": list(items)})


def counts(f: FrontierCore) -> tuple[int, int, int, int, int, int]:
    c = f.counts()
    assert c.conserved, c
    return c.accepted, c.filtered, c.ready, c.delayed, c.in_flight, c.dead


# --- submit ----------------------------------------------------------------------------


def test_submit_one_then_its_duplicate(api: httpx.Client, frontier: FrontierCore) -> None:
    url = "https://example.com/page?b=2&a=1"
    r = submit(
        api,
        {"url": url, "callback": "parse_page", "priority": 5, "meta": {"depth": 1, "tags": ["x"]}},
    )
    assert r.status_code == 200, r.text
    expected_id = scrapy_fingerprint(Request(url)).hex()
    assert r.json() == {
        "crawl": "c",
        "accepted": 1,
        "filtered": 0,
        "items": [{"accepted": True, "id": expected_id}],
    }
    r = submit(api, {"url": url})
    assert r.json()["filtered"] == 1 and r.json()["items"] == [
        {"accepted": False, "id": expected_id}
    ]
    # the scheduler's own seeding path dedupes against it too
    assert seed([url], settings=frontier.settings, crawl="c", client=frontier.client).filtered == 1
    assert counts(frontier) == (1, 2, 1, 0, 0, 0)
    [lease] = frontier.lease("w1", 5)
    env = lease.envelope
    assert (env.url, env.callback, env.priority, env.meta) == (
        url,
        "parse_page",
        5,
        {"depth": 1, "tags": ["x"]},
    )
    assert lease.id.hex() == expected_id


def test_submit_recrawl_accepts_done_requests_only(
    api: httpx.Client, frontier: FrontierCore
) -> None:
    url = "https://example.com/done"
    assert submit(api, {"url": url}).json()["accepted"] == 1
    frontier.ack(frontier.lease("w1", 5))
    assert submit(api, {"url": url}).json()["accepted"] == 0  # done: a duplicate
    again = api.post("/v1/crawls/c/requests", json={"requests": [{"url": url}], "recrawl": True})
    assert again.status_code == 200 and again.json()["accepted"] == 1  # crawled again
    queued = api.post("/v1/crawls/c/requests", json={"requests": [{"url": url}], "recrawl": True})
    assert queued.json()["accepted"] == 0  # but once: it is queued
    assert counts(frontier) == (2, 2, 1, 0, 0, 0)


def test_submit_batch_with_delays_and_dont_filter(
    api: httpx.Client, frontier: FrontierCore
) -> None:
    body_b64 = "AAEC/w=="  # bytes 00 01 02 ff
    r = submit(
        api,
        {"url": "https://example.com/1"},
        {"url": "https://example.com/2", "delay": 60},
        {"url": "https://example.com/1", "delay": 60},  # duplicate of item 0
        {
            "url": "https://example.com/3",
            "method": "post",
            "body": body_b64,
            "body_base64": True,
            "headers": [["X-Token", "a"], ["X-Token", "b"]],
        },
        {"url": "https://example.com/4", "dont_filter": True},
        {"url": "https://example.com/4", "dont_filter": True, "delay": 0.5},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert [i["accepted"] for i in out["items"]] == [True, True, False, True, True, True]
    assert (out["accepted"], out["filtered"]) == (5, 1)
    assert "id" not in out["items"][4] and "id" not in out["items"][5]
    assert out["items"][0]["id"] == out["items"][2]["id"]
    assert counts(frontier) == (5, 1, 3, 2, 0, 0)
    post_id = out["items"][3]["id"]
    assert (
        post_id
        == scrapy_fingerprint(
            Request("https://example.com/3", method="POST", body=b"\x00\x01\x02\xff")
        ).hex()
    )
    d = api.get(f"/v1/crawls/c/requests/{post_id}").json()
    assert (d["method"], d["body"], d["body_base64"]) == ("POST", body_b64, True)
    assert d["headers"] == [["X-Token", "a"], ["X-Token", "b"]]
    d = api.get(f"/v1/crawls/c/requests/{out['items'][1]['id']}").json()
    assert d["state"] == "delayed" and d["due"] > time.time() + 50


BAD_ITEMS = [
    ({"url": "ftp://example.com/x"}, "requests[2].url", "http"),
    ({"url": "example.com/no-scheme"}, "requests[2].url", "http"),
    ({"url": "https://example.com/" + "a" * 9000}, "requests[2].url", "8192"),
    ({"url": "https://e.com", "priority": 1_000_001}, "requests[2].priority", "1000000"),
    ({"url": "https://e.com", "callback": "not-a-name"}, "requests[2].callback", "identifier"),
    ({"url": "https://e.com", "meta": {"n": 2**70}}, "requests[2].meta", "64 bits"),
    ({"url": "https://e.com", "meta": [1]}, "requests[2].meta", "object"),
    ({"url": "https://e.com", "delay": -1}, "requests[2].delay", "greater than or equal"),
    ({"url": "https://e.com", "delay": 1e12}, "requests[2].delay", "less than or equal"),
    ({"url": "https://e.com", "body": "%%%", "body_base64": True}, "requests[2].body", "base64"),
    ({"url": "https://e.com", "method": "GE T"}, "requests[2].method", "pattern"),
    ({"url": "https://e.com", "headers": {"Bad Name": "v"}}, "requests[2].headers", ""),
    (
        {"url": "https://e.com", "headers": {"X": "a\r\nInjected: 1"}},
        "requests[2].headers",
        "pattern",
    ),
    ({"url": "https://e.com", "colour": "red"}, "requests[2].colour", "not permitted"),
    ({"method": "GET"}, "requests[2].url", "required"),
    # strict types: no coercion (issue 11, item 3)
    ({"url": "https://e.com", "priority": "5"}, "requests[2].priority", "integer"),
    ({"url": "https://e.com", "priority": True}, "requests[2].priority", "integer"),
    ({"url": "https://e.com", "priority": 5.5}, "requests[2].priority", "integer"),
    ({"url": "https://e.com", "headers": [["", "v"]]}, "requests[2].headers", ""),
    ({"url": "https://e.com", "headers": [["A", "v", "x"]]}, "requests[2].headers", ""),
    ({"url": "https://e.com", "delay": False}, "requests[2].delay", "number"),
    ({"url": "https://e.com", "delay": "1"}, "requests[2].delay", "number"),
    ({"url": "https://e.com", "dont_filter": "yes"}, "requests[2].dont_filter", "boolean"),
    ({"url": "https://e.com", "dont_filter": 1}, "requests[2].dont_filter", "boolean"),
    ({"url": "https://e.com", "body_base64": "true"}, "requests[2].body_base64", "boolean"),
    # hosts (item 4) and callbacks (item 5)
    ({"url": "http://exa mple.com/"}, "requests[2].url", "whitespace or control"),
    ({"url": "http://exa\x00mple.com/"}, "requests[2].url", "whitespace or control"),
    ({"url": "http://-bad-.example/"}, "requests[2].url", "not a valid host name"),
    ({"url": "http://[::zz]/"}, "requests[2].url", "IPv6"),
    ({"url": "http://bücher.example/"}, "requests[2].url", "xn--"),
    ({"url": "https://user\\evil.example@example.com/"}, "requests[2].url", "backslash"),
    ({"url": "https://e.com", "callback": "_set_crawler"}, "requests[2].callback", "private"),
    (
        {"url": "https://e.com", "callback": "start_requests"},
        "requests[2].callback",
        "Scrapy's or redcrawl's",
    ),
    (
        {"url": "https://e.com", "callback": "spider_idle"},
        "requests[2].callback",
        "Scrapy's or redcrawl's",
    ),
]


@pytest.mark.parametrize(
    ("item", "loc", "words"),
    BAD_ITEMS,
    ids=[x[1].split(".")[-1] + str(i) for i, x in enumerate(BAD_ITEMS)],
)
def test_invalid_item_rejects_the_whole_batch(
    api: httpx.Client, redis_client: redis.Redis, item: dict[str, Any], loc: str, words: str
) -> None:
    r = submit(api, {"url": "https://example.com/ok1"}, {"url": "https://example.com/ok2"}, item)
    assert r.status_code == 422, r.text
    body = r.json()
    assert loc in body["detail"] and words in body["detail"], body
    assert any(e["loc"].startswith(loc) for e in body["errors"])
    assert redis_client.dbsize() == 0  # nothing written, not even the good items


def test_batch_size_limits(api: httpx.Client, redis_client: redis.Redis) -> None:
    r = submit(api, *({"url": f"https://example.com/{i}"} for i in range(MAX_BATCH + 1)))
    assert r.status_code == 422 and f"at most {MAX_BATCH}" in r.json()["detail"]
    r = submit(api)
    assert r.status_code == 422 and "requests" in r.json()["detail"]
    r = api.post(
        "/v1/crawls/c/requests", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422
    assert redis_client.dbsize() == 0
    r = submit(api, *({"url": f"https://example.com/{i}"} for i in range(MAX_BATCH)))
    assert r.json()["accepted"] == MAX_BATCH


def test_invalid_crawl_name_is_422_with_the_rule(
    api: httpx.Client, redis_client: redis.Redis
) -> None:
    for path in ("/v1/crawls/bad%7Bname%7D/requests", "/v1/crawls/-dash/requests"):
        r = api.post(path, json={"requests": [{"url": "https://example.com/"}]})
        assert r.status_code == 422, r.text
        assert "crawl name" in r.json()["detail"] and "letters, digits" in r.json()["detail"]
    r = api.get("/v1/crawls/" + "x" * 129)
    assert r.status_code == 422 and "1-128 characters" in r.json()["detail"]
    assert redis_client.dbsize() == 0


# --- auth --------------------------------------------------------------------------------

ENDPOINTS = [  # method, path, admin?
    ("POST", "/v1/crawls/c/requests", True),
    ("POST", "/v1/crawls/c/dead/requeue", True),
    ("POST", "/v1/crawls/c/workers/w1/reclaim", True),
    ("POST", "/v1/crawls/c/pause", True),
    ("POST", "/v1/crawls/c/resume", True),
    ("DELETE", "/v1/crawls/c", True),
    ("GET", "/v1/crawls", False),
    ("GET", "/v1/crawls/c", False),
    ("GET", "/v1/crawls/c/pending", False),
    ("GET", "/v1/crawls/c/inflight", False),
    ("GET", "/v1/crawls/c/dead", False),
    ("GET", "/v1/crawls/c/workers", False),
    ("GET", f"/v1/crawls/c/requests/{'ab' * 20}", False),
]


def _call(client: httpx.Client, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    body = {"requests": [{"url": "https://example.com/"}]} if path.endswith("/requests") else None
    return client.request(method, path, json=body, headers=headers)


def test_auth_matrix(api_server: ApiServer, redis_client: redis.Redis) -> None:
    redis_client.hset("rc:{c}:stats", "accepted", 0)  # exists, so no 404 hides a 403
    with httpx.Client(base_url=api_server.url, timeout=10) as c:
        for method, path, needs_admin in ENDPOINTS:
            where = f"{method} {path}"
            none = _call(c, method, path, {})
            assert none.status_code == 401, where
            assert none.headers["www-authenticate"] == "Bearer"
            assert "Bearer" in none.json()["detail"]
            assert _call(c, method, path, {"Authorization": "Bearer nope"}).status_code == 401
            assert _call(c, method, path, {"Authorization": f"Basic {ADMIN}"}).status_code == 401, (
                where
            )
            ro = _call(c, method, path, AUTH_READ)
            if needs_admin:
                assert ro.status_code == 403, where
                assert "admin token" in ro.json()["detail"]
            else:
                assert ro.status_code in (200, 404), (where, ro.text)
            adm = _call(c, method, path, AUTH_ADMIN)
            assert adm.status_code in (200, 404), (where, adm.text)
        for path in ("/v1/health", "/v1/ready", "/openapi.json", "/docs"):
            assert c.get(path).status_code == 200, path


def test_open_without_tokens_on_loopback(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    settings = Settings(redis_url=redis7.url)
    server = ApiServer(settings, redis7_client)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            r = submit(c, {"url": "https://example.com/open"})
            assert r.status_code == 200 and r.json()["accepted"] == 1
            assert c.delete("/v1/crawls/c").status_code == 200
    finally:
        server.stop()


def test_serve_refuses_non_loopback_without_tokens() -> None:
    for host in ("0.0.0.0", "192.168.1.10", "::", "example.com"):
        with pytest.raises(ConfigError, match="REDCRAWL_API_HOST") as exc:
            serve(Settings(api_host=host, redis_url="redis://127.0.0.1:1/0"))
        assert "REDCRAWL_API_ADMIN_TOKENS" in str(exc.value)
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(Settings(api_host=host))
    check_bind(Settings(api_host="0.0.0.0", api_admin_tokens=("t" * 16,)))
    check_bind(Settings(api_host="0.0.0.0", api_tokens=("t" * 16,)))


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
@pytest.mark.parametrize(
    ("field", "name"),
    [("api_tokens", "REDCRAWL_API_TOKENS"), ("api_admin_tokens", "REDCRAWL_API_ADMIN_TOKENS")],
)
def test_serve_refuses_a_short_token(host: str, field: str, name: str) -> None:
    """A token anyone could guess (under 16 characters) guards nothing: `serve` refuses
    it, naming the setting but not the token, loopback or not."""
    good = "g" * 16
    for tokens in (("hunter2",), (good, "abcdefghijklmno")):
        given: dict[str, Any] = {field: tokens}
        with pytest.raises(ConfigError, match=name) as exc:
            serve(Settings(api_host=host, redis_url="redis://127.0.0.1:1/0", **given))
        assert "16" in str(exc.value) and tokens[-1] not in str(exc.value)
    fine: dict[str, Any] = {field: (good,)}
    check_bind(Settings(api_host=host, **fine))


def test_redcrawl_serve_command(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    """`redcrawl serve` runs uvicorn until interrupted and says it is open on loopback."""
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "REDCRAWL_REDIS_URL": redis7.url,
        "REDCRAWL_API_PORT": str(port),
    }
    env.pop("REDCRAWL_API_TOKENS", None)
    env.pop("REDCRAWL_API_ADMIN_TOKENS", None)
    with serving(tmp_path, env, f"http://127.0.0.1:{port}/v1/ready") as (r, log):
        assert r.json() == {"status": "ok"}
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/crawls/cli/requests",
            json={"requests": [{"url": "https://example.com/"}]},
        )
        assert r.json()["accepted"] == 1
        assert redis7_client.exists("rc:{cli}:stats")
    assert "without authentication" in log.read_text().lower()
    bad = subprocess.run(
        [sys.executable, "-m", "redcrawl", "serve", "--host", "0.0.0.0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "REDCRAWL_API_HOST" in bad.stdout + bad.stderr


# --- inspect -----------------------------------------------------------------------------


def test_list_and_detail(
    api: httpx.Client, api_server: ApiServer, redis_client: redis.Redis
) -> None:
    # crawls no other test of this module's API server pushed to: the server registers a
    # crawl at its first push to it and remembers that, and the fixture empties Redis
    # under it between tests (under pytest-xdist any of them may have come before)
    assert api.get("/v1/crawls").json() == {"crawls": []}
    submit(api, {"url": "https://example.com/a"}, {"url": "https://example.com/b"}, crawl="listed")
    submit(api, {"url": "https://example.com/z", "delay": 30}, crawl="other.listed")
    crawls = {c["crawl"]: c for c in api.get("/v1/crawls").json()["crawls"]}
    assert set(crawls) == {"listed", "other.listed"}
    assert (crawls["listed"]["ready"], crawls["listed"]["accepted"]) == (2, 2)
    assert (crawls["other.listed"]["delayed"], crawls["other.listed"]["finished"]) == (1, False)
    assert len(api.get("/v1/crawls", params={"limit": 1}).json()["crawls"]) == 1

    frontier = open_frontier(redis_client, api_server.settings, "listed")
    frontier.renew("w-alive", ttl=60)
    frontier.renew("w-gone", ttl=0.001)
    time.sleep(0.01)
    d = api.get("/v1/crawls/listed").json()
    assert (d["ready"], d["paused"], d["workers_alive"], d["finished"]) == (2, False, 1, False)
    w = api.get("/v1/crawls/listed/workers").json()
    assert [(x["worker"], x["alive"]) for x in w["workers"]] == [
        ("w-alive", True),
        ("w-gone", False),
    ]
    assert w["workers"][0]["heartbeat_deadline"] > w["server_time"] + 50


def test_rates_from_samples(
    api_server: ApiServer, api: httpx.Client, frontier: FrontierCore
) -> None:
    submit(api, {"url": "https://example.com/seed"}, crawl="rated")
    assert api.get("/v1/crawls/rated").json()["rates"]["done_per_s"] is None
    submit(api, *({"url": f"https://example.com/{i}"} for i in range(10)), crawl="rated")
    f = open_frontier(frontier.client, frontier.settings, "rated")
    f.ack(f.lease("w", 4))
    assert isinstance(api_server.clock, SecondsClock)
    api_server.clock.advance(1.1)
    rates = api.get("/v1/crawls/rated").json()["rates"]
    assert 1.0 <= rates["window"] < 5
    assert rates["accepted_per_s"] == pytest.approx(10 / rates["window"], rel=0.01)
    assert rates["done_per_s"] == pytest.approx(4 / rates["window"], rel=0.01)


def test_crawl_detail_shows_the_politeness_counters(
    api: httpx.Client, frontier: FrontierCore
) -> None:
    """Lists crawls (created with fleet-wide politeness): deferrals by reason, keys
    blocked now, politeness wait; streams crawls (no fleet-wide politeness yet): null."""
    submit(api, {"url": "https://a.test/1"}, {"url": "https://b.test/1"})
    if frontier.politeness is None:
        assert api.get("/v1/crawls/c").json()["politeness"] is None
        return
    got = {x.envelope.url: x for x in frontier.lease("w", 10)}
    assert frontier.defer(got["https://a.test/1"], "429", retry_after=600) == "deferred"
    pol = api.get("/v1/crawls/c").json()["politeness"]
    assert pol == {"key": "host", "blocked": 1, "deferred": {"429": 1}, "wait_s": 0.0}


def test_unknown_crawl_is_404(api: httpx.Client) -> None:
    for method, path, _ in ENDPOINTS:
        if path.endswith("/requests") or path == "/v1/crawls":
            continue
        r = api.request(method, path.replace("/crawls/c", "/crawls/never", 1))
        assert r.status_code == 404, (method, path, r.text)
        assert "does not exist" in r.json()["detail"]


def test_inflight_dead_pending_and_describe(api: httpx.Client, frontier: FrontierCore) -> None:
    r = submit(api, *({"url": f"https://example.com/{i}"} for i in range(4)))
    ids = [i["id"] for i in r.json()["items"]]
    pending = api.get("/v1/crawls/c/pending").json()["items"]
    assert [p["id"] for p in pending] == ids  # fifo: served in submit order
    assert len(api.get("/v1/crawls/c/pending", params={"limit": 2}).json()["items"]) == 2

    leases = frontier.lease("w1", 2)
    assert [le.id.hex() for le in leases] == ids[:2]
    assert frontier.nack(leases[1], "HTTP 500 boom", retry=False) == "dead"

    inflight = api.get("/v1/crawls/c/inflight").json()["items"]
    assert [(x["id"], x["worker"], x["attempts"]) for x in inflight] == [(ids[0], "w1", 1)]
    assert inflight[0]["deadline"] > inflight[0]["since"]
    dead = api.get("/v1/crawls/c/dead").json()["items"]
    assert [(x["id"], x["error"], x["url"]) for x in dead] == [
        (ids[1], "HTTP 500 boom", "https://example.com/1")
    ]

    d = api.get(f"/v1/crawls/c/requests/{ids[0]}").json()
    assert (d["state"], d["worker"], d["attempts"], d["url"]) == (
        "in_flight",
        "w1",
        1,
        "https://example.com/0",
    )
    d = api.get(f"/v1/crawls/c/requests/{ids[1].upper()}").json()
    assert (d["state"], d["error"]) == ("dead", "HTTP 500 boom")
    assert api.get(f"/v1/crawls/c/requests/{ids[2]}").json()["state"] == "ready"
    frontier.ack(leases[:1])
    r = api.get(f"/v1/crawls/c/requests/{ids[0]}")
    assert r.status_code == 404 and "done" in r.json()["detail"]
    assert api.get(f"/v1/crawls/c/requests/{'0' * 40}").status_code == 404
    assert api.get("/v1/crawls/c/requests/%2399999").status_code == 404
    assert api.get("/v1/crawls/c/requests/nothex").status_code == 422
    assert api.get("/v1/crawls/c/dead", params={"limit": 0}).status_code == 422
    assert api.get("/v1/crawls/c/dead", params={"limit": 1001}).status_code == 422


def test_describe_dont_filter_request_by_seq_id(api: httpx.Client, frontier: FrontierCore) -> None:
    submit(api, {"url": "https://example.com/again", "dont_filter": True, "meta": {"k": "v"}})
    [p] = api.get("/v1/crawls/c/pending").json()["items"]
    assert p["id"].startswith("#")
    d = api.get(f"/v1/crawls/c/requests/{p['id'].replace('#', '%23')}").json()
    assert (d["dont_filter"], d["meta"], d["state"]) == (True, {"k": "v"}, "ready")


# --- steer -------------------------------------------------------------------------------


def _make_dead(api: httpx.Client, frontier: FrontierCore, n: int) -> list[str]:
    r = submit(api, *({"url": f"https://example.com/d{i}"} for i in range(n)))
    for lease in frontier.lease("w1", n):
        frontier.nack(lease, "gone", retry=False)
    assert counts(frontier)[5] == n
    return [i["id"] for i in r.json()["items"]]


def test_requeue_dead_by_id_then_all(api: httpx.Client, frontier: FrontierCore) -> None:
    ids = _make_dead(api, frontier, 3)
    r = api.post("/v1/crawls/c/dead/requeue", json={"ids": [ids[1]]})
    assert r.json() == {"crawl": "c", "requeued": 1}
    assert counts(frontier) == (3, 0, 1, 0, 0, 2)
    assert api.get(f"/v1/crawls/c/requests/{ids[1]}").json()["state"] == "ready"
    r = api.post("/v1/crawls/c/dead/requeue", json={"limit": 1})
    assert r.json()["requeued"] == 1
    r = api.post("/v1/crawls/c/dead/requeue")  # no body: all
    assert r.json()["requeued"] == 1
    assert counts(frontier) == (3, 0, 3, 0, 0, 0)
    assert api.get("/v1/crawls/c").json()["requeued"] == 3
    r = api.post("/v1/crawls/c/dead/requeue", json={"ids": ["xyz"]})
    assert r.status_code == 422 and "ids[0]" in r.json()["detail"]


def test_reclaim_a_workers_leases(api: httpx.Client, frontier: FrontierCore) -> None:
    submit(api, *({"url": f"https://example.com/{i}"} for i in range(3)))
    frontier.lease("w-stuck", 2)
    frontier.lease("w-ok", 1)
    r = api.post("/v1/crawls/c/workers/w-stuck/reclaim")
    assert r.json() == {"crawl": "c", "worker": "w-stuck", "reclaimed": 2}
    assert counts(frontier) == (3, 0, 2, 0, 1, 0)
    assert [x["worker"] for x in api.get("/v1/crawls/c/inflight").json()["items"]] == ["w-ok"]
    again = api.post("/v1/crawls/c/workers/w-stuck/reclaim").json()
    assert again["reclaimed"] == 0


def test_pause_and_resume(api: httpx.Client, frontier: FrontierCore) -> None:
    submit(api, {"url": "https://example.com/p"})
    assert api.post("/v1/crawls/c/pause").json() == {"crawl": "c", "paused": True}
    assert api.get("/v1/crawls/c").json()["paused"] is True
    assert frontier.lease("w1", 5) == []
    assert submit(api, {"url": "https://example.com/q"}).json()["accepted"] == 1
    assert api.post("/v1/crawls/c/resume").json() == {"crawl": "c", "paused": False}
    assert len(frontier.lease("w1", 5)) == 2


def test_purge(api: httpx.Client, frontier: FrontierCore) -> None:
    submit(api, {"url": "https://example.com/x"}, {"url": "https://example.com/y", "delay": 10})
    _make_dead(api, frontier, 1)
    assert api.delete("/v1/crawls/c").json() == {"crawl": "c", "purged": True}
    assert frontier.counts().accepted == 0
    # gone for the API until a request is submitted again
    assert api.get("/v1/crawls/c").status_code == 404
    assert api.get("/v1/crawls/c/dead").status_code == 404
    assert api.delete("/v1/crawls/c").status_code == 404
    assert "c" not in [x["crawl"] for x in api.get("/v1/crawls").json()["crawls"]]
    # dedupe is gone too: the same URL is accepted again
    assert submit(api, {"url": "https://example.com/x"}).json()["accepted"] == 1


# --- health ------------------------------------------------------------------------------


def test_ready_is_503_when_redis_is_down(tmp_path: Path) -> None:
    own = RedisServer(redis_binary("7"), tmp_path)
    client = redis.Redis.from_url(own.url, socket_connect_timeout=2, socket_timeout=2)
    server = ApiServer(api_settings(own.url), client)
    try:
        with httpx.Client(base_url=server.url, headers=AUTH_ADMIN, timeout=30) as c:
            assert c.get("/v1/ready").json() == {"status": "ok"}
            assert submit(c, {"url": "https://example.com/"}).status_code == 200
            own.stop()
            r = c.get("/v1/ready")
            assert r.status_code == 503, r.text
            assert "unavailable" in r.json()["detail"] and "retry" in r.json()["detail"]
            assert c.get("/v1/health").json() == {"status": "ok"}
            for method, path, _ in ENDPOINTS:
                r = _call(c, method, path, AUTH_ADMIN)
                assert r.status_code == 503, (method, path, r.text)
                assert "Redis" in r.json()["detail"]
    finally:
        server.stop()
        own.stop()
        client.close()


def test_openapi_documents_limits_and_errors(api: httpx.Client) -> None:
    schema = api.get("/openapi.json").json()
    submit_in = schema["components"]["schemas"]["SubmitIn"]["properties"]["requests"]
    assert (submit_in["minItems"], submit_in["maxItems"]) == (1, MAX_BATCH)
    item = schema["components"]["schemas"]["RequestIn"]["properties"]
    assert item["priority"]["maximum"] == 1_000_000 and item["url"]["maxLength"] == 8192
    op = schema["paths"]["/v1/crawls/{crawl}/requests"]["post"]
    assert {"401", "403", "422", "503"} <= set(op["responses"])
    assert "404" in schema["paths"]["/v1/crawls/{crawl}"]["get"]["responses"]
    assert "bearer" in str(schema["components"]["securitySchemes"]).lower()


def test_streams_crawl_shards_and_counts(
    api: httpx.Client, frontier: FrontierCore, redis_client: redis.Redis
) -> None:
    """The API follows the backend a crawl was created with (a streams crawl with 4
    shards here, whatever the API's own settings), and shows its shards."""
    from redcrawl.frontier.streams import shard_of

    worker = open_frontier(
        redis_client,
        api_settings("redis://unused", backend="streams", shards=4, politeness=False),
        "s",
    )
    assert isinstance(worker, StreamsFrontier)
    seed(["https://a.example/0"], settings=worker.settings, crawl="s", client=redis_client)
    r = submit(
        api,
        *({"url": f"https://a.example/{i}", "priority": 2 if i == 3 else 0} for i in range(1, 4)),
        crawl="s",
    )
    assert r.json()["accepted"] == 3
    (lease,) = worker.lease("w1", 1)  # the high-priority one comes first
    assert lease.envelope.url == "https://a.example/3"
    d = api.get("/v1/crawls/s").json()
    assert (d["accepted"], d["ready"], d["in_flight"]) == (4, 3, 1)
    body = api.get("/v1/crawls/s/shards").json()
    assert body["shards"] == 4
    shard = shard_of("https://a.example/", 4)
    rows = {(s["shard"], s["stream"]): s for s in body["streams"]}
    assert set(rows) == {(shard, "high"), (shard, "low")}
    high, low = rows[(shard, "high")], rows[(shard, "low")]
    assert (high["length"], high["pending"], high["ready"]) == (1, 1, 0)
    assert (low["length"], low["pending"], low["ready"]) == (3, 0, 3)
    (entry,) = high["entries"]
    assert (entry["id"], entry["consumer"], entry["deliveries"]) == (lease.id.hex(), "w1", 1)
    assert 0 <= entry["idle"] < 5
    assert api.get("/v1/crawls/s/inflight").json()["items"][0]["worker"] == "w1"
    # a lists crawl has no shards (whatever the API's own backend)
    seed(
        ["https://example.com/"],
        settings=api_settings("redis://unused", backend="lists"),
        crawl="l",
        client=redis_client,
    )
    r = api.get("/v1/crawls/l/shards")
    assert r.status_code == 409 and "lists backend" in r.json()["detail"]


def test_bodies_over_the_limit_are_refused_before_they_are_read(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(redis7.url)
    server = ApiServer(api_settings(redis7.url, api_max_body=4096), client)
    items = [{"url": f"https://example.com/{i}"} for i in range(300)]  # about 10 KB
    try:
        with httpx.Client(base_url=server.url, headers=AUTH_ADMIN, timeout=10) as api:
            r = submit(api, *items)  # Content-Length says it all
            assert r.status_code == 413, r.text
            assert "REDCRAWL_API_MAX_BODY" in r.json()["detail"]
            assert "4096" in r.json()["detail"]

            payload = json.dumps({"requests": items}).encode()

            def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
                for i in range(0, len(payload), 1000):
                    yield payload[i : i + 1000]

            r = api.post(
                "/v1/crawls/c/requests",
                content=chunks(),
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 413, r.text
            assert redis7_client.dbsize() == 0  # nothing of either call was stored

            small = json.dumps({"requests": items[:MAX_BATCH]}).encode()
            r = api.post(
                "/v1/crawls/c/requests",
                content=iter([small[:50], small[50:]]),
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 200 and r.json()["accepted"] == MAX_BATCH, r.text
            assert api.get("/v1/crawls/c").status_code == 200
    finally:
        server.stop()
        client.close()


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("where", ["meta", "delay", "priority"])
def test_non_finite_numbers_are_refused_everywhere(
    api: httpx.Client, redis_client: redis.Redis, number: str, where: str
) -> None:
    value = {"meta": f'{{"deep": [1, {{"x": {number}}}]}}', "delay": number, "priority": number}[
        where
    ]
    body = f'{{"requests": [{{"url": "https://example.com/", "{where}": {value}}}]}}'.encode()
    r = api.post(
        "/v1/crawls/c/requests", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"] and "requests[0]" in r.json()["detail"], r.text
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe{\x00}",
        b'{"requests": [' + b"[" * 1000 + b"]" * 1000 + b"]}",
        b"{",
        b"[]",
        b"null",
        b'"x"',
    ],
)
def test_unparseable_bodies_are_422_with_errors(
    api: httpx.Client, redis_client: redis.Redis, body: bytes
) -> None:
    for path in ("/v1/crawls/c/requests", "/v1/crawls/c/dead/requeue"):
        r = api.post(path, content=body, headers={"Content-Type": "application/json"})
        if r.status_code == 404:  # requeue on a crawl that does not exist: body read first
            continue
        assert r.status_code == 422, (path, r.text)
        assert r.json()["errors"][0]["loc"].startswith("body") or r.json()["errors"][0][
            "loc"
        ].startswith("requests"), r.text
    assert redis_client.dbsize() == 0


def test_405_lists_every_method_of_the_path(api: httpx.Client) -> None:
    submit(api, {"url": "https://example.com/"})
    for method, path, allowed in (
        ("PATCH", "/v1/crawls/c", {"GET", "DELETE"}),
        ("PUT", "/v1/crawls/c", {"GET", "DELETE"}),
        ("GET", "/v1/crawls/c/pause", {"POST"}),
        ("DELETE", "/v1/crawls", {"GET"}),
    ):
        r = api.request(method, path)
        assert r.status_code == 405, (method, path, r.text)
        assert (
            allowed <= {m.strip() for m in r.headers["allow"].split(",")} <= (allowed | {"HEAD"})
        ), r.headers["allow"]
        assert r.json()["detail"]


def test_response_models_follow_the_frontier_records() -> None:
    """Responses are built from the frontier's records (model_validate), so their fields
    are the records' fields: a field added to a record and not to its model shows here."""
    from dataclasses import fields

    from redcrawl.api import models as m
    from redcrawl.frontier.base import Counts, DeadInfo, InflightInfo, PendingInfo
    from redcrawl.frontier.streams import PendingEntry, ShardInfo

    def names(record: Any) -> set[str]:
        return {f.name for f in fields(record)}

    for model, record in (
        (m.PendingItem, PendingInfo),
        (m.InflightItem, InflightInfo),
        (m.DeadItem, DeadInfo),
        (m.PendingEntryItem, PendingEntry),
    ):
        assert set(model.model_fields) == names(record), model
    assert set(m.ShardItem.model_fields) == names(ShardInfo) | {"ready"}
    assert set(m.CrawlSummary.model_fields) == names(Counts) | {"crawl", "finished"}
    assert set(m.CrawlListItem.model_fields) == set(m.CrawlSummary.model_fields) | {"error"}


def test_a_purged_crawl_is_reopened_with_its_new_layout(
    api: httpx.Client, api_server: ApiServer, redis_client: redis.Redis
) -> None:
    submit(api, {"url": "https://example.com/"}, crawl="re")
    was = api_server.settings.backend
    assert api.get("/v1/crawls/re/shards").status_code == (200 if was == "streams" else 409)
    assert api.delete("/v1/crawls/re").status_code == 200
    other = "lists" if was == "streams" else "streams"
    seed(
        ["https://example.com/"],
        settings=api_settings("redis://unused", backend=other),
        crawl="re",
        client=redis_client,
    )
    assert api.get("/v1/crawls/re/shards").status_code == (200 if other == "streams" else 409)
    assert api.get("/v1/crawls/re").json()["ready"] == 1


def test_query_values_are_whole_numbers_given_once(api: httpx.Client) -> None:
    submit(api, {"url": "https://example.com/"})
    for query in (
        "limit=4%0C",
        "limit=+4",
        "limit=4.0",
        "limit=%20%204",
        "limit=1&limit=2",
        "limit=x&limit=4",
    ):
        r = api.get(f"/v1/crawls?{query}")
        assert r.status_code == 422, (query, r.text)
        assert r.json()["errors"][0]["loc"] == "limit", r.text
    assert len(api.get("/v1/crawls?limit=007").json()["crawls"]) == 1
