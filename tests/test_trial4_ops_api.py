"""Operator trial (session 4): what the API says to a stranger's bad input. Real
redis-server, the app served by a real uvicorn (tests/apikit.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from .apikit import ADMIN, ApiServer, api_settings
from .conftest import RedisServer


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
