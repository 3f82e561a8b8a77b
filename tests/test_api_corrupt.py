"""Corrupt crawl state seen through the API (issue 11, items 10 and 12): garbage written
straight into Redis with a raw client must never hide the other crawls, and every error is
JSON in the documented shape (never a plain-text 500). Real uvicorn, real Redis 7."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from redcrawl.frontier import open_frontier
from redcrawl.scrapy.scheduler import seed
from redcrawl.settings import Settings

from .apikit import AUTH_ADMIN, ApiServer, api_settings
from .conftest import RedisServer

CRAWLS = ("a", "b", "c")


@pytest.fixture
def api(redis7: RedisServer, redis7_client: redis.Redis) -> Iterator[httpx.Client]:
    """Crawls a, b and c with two requests each (written by workers: the API has not
    opened them yet); an admin client."""
    settings = api_settings(redis7.url)
    for crawl in CRAWLS:
        seed(
            [f"https://example.com/{crawl}/1", f"https://example.com/{crawl}/2"],
            settings=settings,
            crawl=crawl,
            client=redis7_client,
        )
    server = ApiServer(settings, redis7_client)
    with httpx.Client(base_url=server.url, headers=AUTH_ADMIN, timeout=10) as c:
        yield c
    server.stop()


def _json_error(r: httpx.Response, crawl: str) -> str:
    assert r.status_code == 500, r.text
    assert r.headers["content-type"] == "application/json", r.text
    detail = r.json()["detail"]
    assert f"crawl {crawl!r}" in detail and "purge" in detail, detail
    return str(detail)


def _listed(api: httpx.Client) -> dict[str, dict[str, object]]:
    r = api.get("/v1/crawls")
    assert r.status_code == 200, r.text
    return {c["crawl"]: c for c in r.json()["crawls"]}


CORRUPTIONS = {  # what the frontier cannot repair by itself
    "layout, both copies": lambda r: r.hset(
        "rc:{a}:control", mapping={"layout": "streams/0", "layout.copy": "x"}
    ),
    "wrong type": lambda r: (r.delete("rc:{a}:delayed"), r.set("rc:{a}:delayed", "x")),
}
REPAIRED = {  # what it repairs (docs/frontier.md, "Corrupt state")
    "counter": lambda r: r.hset("rc:{a}:stats", "accepted", "abc"),
    "layout": lambda r: r.hset("rc:{a}:control", "layout", "streams/0"),
}


@pytest.mark.parametrize("corrupt", list(REPAIRED))
def test_repairable_corruption_is_repaired_and_listed(
    api: httpx.Client, redis7_client: redis.Redis, corrupt: str
) -> None:
    REPAIRED[corrupt](redis7_client)
    listed = _listed(api)
    assert set(listed) == set(CRAWLS)
    for crawl in CRAWLS:
        assert listed[crawl]["accepted"] == 2 and listed[crawl]["error"] is None, listed
    assert api.get("/v1/crawls/a").json()["accepted"] == 2


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS))
def test_one_broken_crawl_does_not_hide_the_others(
    api: httpx.Client, redis7_client: redis.Redis, corrupt: str
) -> None:
    CORRUPTIONS[corrupt](redis7_client)
    listed = _listed(api)
    assert set(listed) == set(CRAWLS)
    for crawl in ("b", "c"):
        assert listed[crawl]["accepted"] == 2 and listed[crawl]["error"] is None
    broken = listed["a"]
    assert broken["accepted"] is None and "crawl 'a'" in str(broken["error"]), broken
    _json_error(api.get("/v1/crawls/a"), "a")
    assert api.get("/v1/crawls/b").json()["accepted"] == 2


def test_garbage_lease_entry_is_a_json_error(api: httpx.Client, redis7_client: redis.Redis) -> None:
    settings = api_settings("redis://unused")
    f = open_frontier(redis7_client, settings, "a")
    [lease] = f.lease("w1", 1)
    token = redis7_client.hkeys("rc:{a}:leases")[0]
    redis7_client.hset("rc:{a}:leases", token, b"\xc1 not msgpack")
    for path in ("/v1/crawls/a/inflight", f"/v1/crawls/a/requests/{lease.id.hex()}"):
        r = api.get(path)
        if r.status_code != 200:  # the frontier may learn to skip garbage: then 200 is fine
            _json_error(r, "a")
    # the other crawls are untouched
    g = open_frontier(redis7_client, settings, "b")
    g.lease("w2", 1)
    assert [x["worker"] for x in api.get("/v1/crawls/b/inflight").json()["items"]] == ["w2"]
    assert _listed(api)["b"]["in_flight"] == 1


def test_open_api_reports_corrupt_state_as_json_too(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """The same without tokens (another dependency path)."""
    server = ApiServer(Settings(redis_url=redis7.url), redis7_client)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            c.post("/v1/crawls/a/requests", json={"requests": [{"url": "https://e.com/"}]})
            redis7_client.delete("rc:{a}:delayed")
            redis7_client.set("rc:{a}:delayed", "x")  # a key of the wrong type
            _json_error(c.get("/v1/crawls/a"), "a")
            assert c.get("/v1/crawls").json()["crawls"][0]["error"]
    finally:
        server.stop()
