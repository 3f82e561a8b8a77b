"""The per-crawl fingerprint mode: recorded with the crawl, fixed at creation (real Redis)."""

from __future__ import annotations

import pytest
import redis
from scrapy import Request

from redcrawl.codec import Envelope
from redcrawl.errors import ConfigError
from redcrawl.fingerprint import (
    MODE_FIELD,
    crawl_fingerprint_mode,
    fingerprint,
    fingerprinter_for,
    request_fingerprint,
)
from redcrawl.frontier import open_frontier
from redcrawl.keys import CrawlKeys
from redcrawl.settings import Settings

KEYS = CrawlKeys("c")


def test_new_crawl_records_scrapy_by_default(redis_client: redis.Redis) -> None:
    assert crawl_fingerprint_mode(redis_client, KEYS) == "scrapy"
    assert redis_client.hget(KEYS.control, MODE_FIELD) == b"scrapy"
    # later callers follow it
    assert fingerprinter_for(Settings(), redis_client, KEYS).mode == "scrapy"


def test_new_crawl_records_the_asked_mode_and_workers_follow_it(redis_client: redis.Redis) -> None:
    assert crawl_fingerprint_mode(redis_client, KEYS, "scrapy-redis") == "scrapy-redis"
    fp = fingerprinter_for(Settings(), redis_client, KEYS)  # setting unset: follow the crawl
    assert fp.mode == "scrapy-redis"
    request = Request("http://a.example/x?b=1&a=2")
    assert fp.request(request) == request_fingerprint(request, mode="scrapy-redis")
    assert fp.url("http://a.example/x?b=1&a=2") == fingerprint(
        "http://a.example/x?a=2&b=1", mode="scrapy-redis"
    )


def test_a_setting_contradicting_the_crawl_is_refused(redis_client: redis.Redis) -> None:
    crawl_fingerprint_mode(redis_client, KEYS, "scrapy-redis")
    with pytest.raises(ConfigError, match="created with 'scrapy-redis'"):
        fingerprinter_for(Settings(fingerprinter="scrapy"), redis_client, KEYS)
    other = CrawlKeys("d")
    crawl_fingerprint_mode(redis_client, other)
    with pytest.raises(ConfigError, match="REDCRAWL_FINGERPRINTER"):
        crawl_fingerprint_mode(redis_client, other, "scrapy-redis")


def test_scrapy_redis_mode_refused_on_a_crawl_that_already_has_requests(
    redis_client: redis.Redis,
) -> None:
    """A crawl from before modes were recorded (no field, requests accepted)."""
    frontier = open_frontier(redis_client, Settings(), "c")
    frontier.push([Envelope(url="http://a.example/", fingerprint=fingerprint("http://a.example/"))])
    assert redis_client.hget(KEYS.control, MODE_FIELD) is None
    with pytest.raises(ConfigError, match="already holds requests"):
        crawl_fingerprint_mode(redis_client, KEYS, "scrapy-redis")
    assert crawl_fingerprint_mode(redis_client, KEYS) == "scrapy"


def test_scrapy_redis_mode_and_canonicalize_are_refused(redis_client: redis.Redis) -> None:
    crawl_fingerprint_mode(redis_client, KEYS, "scrapy-redis")
    with pytest.raises(ConfigError, match="REDCRAWL_CANONICALIZE"):
        fingerprinter_for(Settings(canonicalize=True), redis_client, KEYS)


def test_purge_forgets_the_mode(redis_client: redis.Redis) -> None:
    crawl_fingerprint_mode(redis_client, KEYS, "scrapy-redis")
    open_frontier(redis_client, Settings(), "c").purge()
    assert crawl_fingerprint_mode(redis_client, KEYS) == "scrapy"
