"""Operator trial (session 4): what the API says to a stranger's bad input. Real
redis-server, the app served by a real uvicorn (tests/apikit.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .apikit import ADMIN, ApiServer, api_settings
from .conftest import RedisServer, _free_port


@pytest.fixture
def api(redis7: RedisServer, redis7_client: redis.Redis) -> Iterator[httpx.Client]:
    server = ApiServer(api_settings(redis7.url), redis7_client)
    try:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        ) as client:
            yield client
    finally:
        server.stop()


def test_a_bad_crawl_name_in_the_path_is_not_called_a_setting(api: httpx.Client) -> None:
    # before: "crawl: setting REDCRAWL_CRAWL: crawl name 'NO PE' must be ...": the caller
    # set no REDCRAWL_CRAWL, the name came from the URL's path
    r = api.get("/v1/crawls/NO%20PE")
    assert r.status_code == 422, r.text
    body = r.json()
    assert "REDCRAWL_CRAWL" not in r.text
    assert body["detail"].startswith("invalid request: crawl: crawl name 'NO PE' must be")
    assert body["errors"][0]["loc"] == "crawl"


@pytest.mark.parametrize("path", ["/", "/crawls/shop", "/v1/crawls", "/v1/ready"])
def test_the_dashboard_while_redis_is_down_is_503_not_corrupt_state(path: str) -> None:
    # before: "/" answered 500 "the stored state of a crawl cannot be read ...: one of its
    # keys was written by something else than redcrawl or is corrupt ... or purge it":
    # advice to purge a crawl because Redis was down
    port = _free_port()
    down = redis.Redis(port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    server = ApiServer(api_settings(f"redis://127.0.0.1:{port}/0"), down)
    try:
        r = httpx.get(server.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    finally:
        server.stop()
        down.close()
    assert r.status_code == 503, r.text
    assert "purge" not in r.text
    assert "corrupt" not in r.text
    assert "Redis" in r.text
    assert "restart the worker" not in r.text  # a worker's advice, not an API caller's
