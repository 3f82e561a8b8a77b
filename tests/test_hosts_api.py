"""/v1/crawls/{crawl}/hosts: politeness keys seen and steered through the HTTP API (real
uvicorn, real Redis 7), with an override obeyed by a worker's next lease."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.settings import Settings

from .apikit import AUTH_ADMIN, AUTH_READ, ApiServer, api_settings
from .conftest import RedisServer

POLITE = {
    "politeness_concurrency": 2,
    "politeness_delay": 0.0,
    "politeness_randomize": False,
}


@pytest.fixture(scope="module")
def api_server(redis7: RedisServer) -> Iterator[ApiServer]:
    client = redis.Redis.from_url(redis7.url)
    server = ApiServer(api_settings(redis7.url, **POLITE), client)
    yield server
    server.stop()
    client.close()


@pytest.fixture
def api(api_server: ApiServer, redis7_client: redis.Redis) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, headers=AUTH_ADMIN, timeout=10) as c:
        yield c


@pytest.fixture
def worker(api_server: ApiServer, redis7_client: redis.Redis) -> FrontierCore:
    """The frontier of crawl "c" as a worker sees it."""
    return open_frontier(redis7_client, api_server.settings, "c")


def submit(api: httpx.Client, hosts: dict[str, int], crawl: str = "c") -> None:
    items = [{"url": f"https://{h}/p{i}"} for h, n in hosts.items() for i in range(n)]
    api.post(f"/v1/crawls/{crawl}/requests", json={"requests": items}).raise_for_status()


def granted(f: FrontierCore, host: str) -> int:
    return sum(1 for lease in f.lease("w", 100) if lease.envelope.url.split("/")[2] == host)


def test_list_and_show(api: httpx.Client, worker: FrontierCore) -> None:
    submit(api, {"a.test": 3})
    assert len(worker.lease("w", 5)) == 2
    submit(api, {"b.test": 2})
    r = api.get("/v1/crawls/c/hosts", params={"limit": 1})
    assert r.status_code == 200, r.text
    page = r.json()
    assert [(h["key"], h["ready"]) for h in page["hosts"]] == [("b.test", 2)]
    assert page["complete"] and page["scanned"] == 2 and page["next_cursor"] == "1"
    page2 = api.get("/v1/crawls/c/hosts", params={"limit": 1, "cursor": "1"}).json()
    assert [h["key"] for h in page2["hosts"]] == ["a.test"] and page2["next_cursor"] is None
    by_flight = api.get("/v1/crawls/c/hosts", params={"sort": "inflight"}).json()
    assert [(h["key"], h["in_flight"]) for h in by_flight["hosts"]] == [
        ("a.test", 2),
        ("b.test", 0),
    ]
    d = api.get("/v1/crawls/c/hosts/a.test", headers=AUTH_READ).json()
    assert (d["ready"], d["in_flight"], d["why"]) == (1, 2, "all 2 slots in flight")
    assert d["concurrency"] == {"value": 2, "source": "default"}
    assert isinstance(d["concurrency"]["value"], int)  # as `redcrawl hosts show --json`
    assert d["delay"] == {"value": 0.0, "source": "default"}


def test_override_is_obeyed_by_the_next_lease(api: httpx.Client, worker: FrontierCore) -> None:
    submit(api, {"a.test": 10})
    r = api.put("/v1/crawls/c/hosts/a.test", json={"concurrency": 1})
    assert r.status_code == 200, r.text
    assert r.json()["concurrency"] == {"value": 1, "source": "override"}
    assert granted(worker, "a.test") == 1
    api.put("/v1/crawls/c/hosts/a.test", json={"concurrency": 5, "block_for": 600})
    assert granted(worker, "a.test") == 0
    d = api.get("/v1/crawls/c/hosts/a.test").json()
    assert d["why"].startswith("blocked by operator until ")
    assert d["block_until"] == pytest.approx(time.time() + 600, abs=30)
    assert d["override"]["block_until"] == d["block_until"]
    d = api.put("/v1/crawls/c/hosts/a.test", json={"block_until": None}).json()
    assert d["block_until"] is None and d["override"] == {"concurrency": 5}
    assert granted(worker, "a.test") == 4
    until = time.time() + 60
    d = api.put("/v1/crawls/c/hosts/a.test", json={"block_until": until, "paused": True}).json()
    assert d["block_until"] == pytest.approx(until, abs=0.01) and d["paused"]
    r = api.delete("/v1/crawls/c/hosts/a.test")
    assert r.status_code == 200 and r.json()["override"] == {}
    assert r.json()["concurrency"]["source"] == "default"


def test_delete_keeps_robots_crawl_delay(
    api: httpx.Client, worker: FrontierCore, redis7_client: redis.Redis
) -> None:
    submit(api, {"a.test": 1})
    redis7_client.hset(worker.keys.pol_override, "a.test", json.dumps({"crawl_delay": 3}))
    api.put("/v1/crawls/c/hosts/a.test", json={"delay": 0.5}).raise_for_status()
    d = api.delete("/v1/crawls/c/hosts/a.test").json()
    assert d["delay"] == {"value": 3.0, "source": "crawl_delay"} and d["crawl_delay"] == 3.0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"delay": -1}', "delay"),
        ('{"delay": NaN}', "delay"),
        ('{"delay": Infinity}', "delay"),
        ('{"delay": 1e400}', "delay"),
        ('{"delay": 90000}', "delay"),
        ('{"delay": "2"}', "delay"),
        ('{"concurrency": 0}', "concurrency"),
        ('{"concurrency": 10001}', "concurrency"),
        ('{"concurrency": 1.5}', "concurrency"),
        ('{"block_until": 1}', "block_until"),
        ('{"block_until": 1900000000000}', "block_until"),
        ('{"block_for": 0}', "block_for"),
        ('{"block_for": 3000000}', "block_for"),
        ('{"block_until": 1900000000, "block_for": 5}', "block_for"),
        ('{"paused": "yes"}', "paused"),
        ('{"speed": 3}', "speed"),
    ],
)
def test_bad_overrides_get_422_naming_the_field(
    api: httpx.Client, worker: FrontierCore, redis7_client: redis.Redis, body: str, field: str
) -> None:
    submit(api, {"a.test": 1})
    r = api.put(
        "/v1/crawls/c/hosts/a.test", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert any(e["loc"] == field for e in r.json()["errors"]), r.json()
    assert redis7_client.hget(worker.keys.pol_override, "a.test") is None


def test_bad_keys_and_queries(api: httpx.Client, worker: FrontierCore) -> None:
    submit(api, {"a.test": 1})
    assert api.get("/v1/crawls/c/hosts/" + "x" * 256).status_code == 422
    r = api.get("/v1/crawls/c/hosts/" + "é" * 200)  # 200 characters, 400 bytes
    assert r.status_code == 404 and "255" in r.json()["detail"]
    r = api.get("/v1/crawls/c/hosts/a%01b")
    assert r.status_code == 404 and "control characters" in r.json()["detail"]
    assert api.get("/v1/crawls/c/hosts", params={"sort": "name"}).status_code == 422
    assert api.get("/v1/crawls/c/hosts", params={"cursor": "-1"}).status_code == 422
    assert api.get("/v1/crawls/c/hosts", params={"limit": "0"}).status_code == 422
    assert api.get("/v1/crawls/nope/hosts").status_code == 404


def test_writes_need_an_admin_token(api: httpx.Client, worker: FrontierCore) -> None:
    submit(api, {"a.test": 1})
    url = "/v1/crawls/c/hosts/a.test"
    assert api.get(url, headers=AUTH_READ).status_code == 200
    assert api.put(url, json={"delay": 1}, headers=AUTH_READ).status_code == 403
    assert api.delete(url, headers=AUTH_READ).status_code == 403
    assert api.put(url, json={"delay": 1}, headers={"Authorization": ""}).status_code == 401


@pytest.mark.parametrize(
    "changes", [{"politeness": False}, {"backend": "streams", "politeness": False}]
)
def test_a_crawl_without_politeness_gets_409(
    api: httpx.Client, redis7_client: redis.Redis, changes: dict[str, Any]
) -> None:
    settings = Settings(**changes)
    from redcrawl.codec import Envelope

    open_frontier(redis7_client, settings, "old").push([Envelope(url="https://a.test/")])
    for method, url in [
        ("GET", "/v1/crawls/old/hosts"),
        ("GET", "/v1/crawls/old/hosts/a.test"),
        ("PUT", "/v1/crawls/old/hosts/a.test"),
        ("DELETE", "/v1/crawls/old/hosts/a.test"),
    ]:
        r = api.request(method, url, json={"delay": 1} if method == "PUT" else None)
        assert r.status_code == 409, (method, url, r.text)
        assert "no fleet-wide politeness" in r.json()["detail"]
        assert "new crawl name" in r.json()["detail"]
