"""The client's push path (issue 16, client CPU): the fingerprint reads a request's meta
without creating it, and a record is built with its push stamp in one piece; both give
the bytes they gave before."""

from __future__ import annotations

import hashlib

import pytest
import scrapy
from scrapy.utils.request import fingerprint as scrapy_fingerprint

from redcrawl.codec import Envelope
from redcrawl.fingerprint import request_fingerprint
from redcrawl.fingerprint.hashing import _digest
from redcrawl.frontier.core import push_stamp
from redcrawl.frontier.records import from_record, parse_record, push_time, record, record_key

URLS = [
    "http://example.com/product/7?ref=list&page=7",
    "https://Example.com:8080/a/b?z=1&a=2#frag",
    "http://example.com/caf\u00e9?q=\u00e9 x",
]


@pytest.mark.parametrize("url", URLS)
def test_fingerprint_leaves_meta_unmade_and_equals_scrapys(url: str) -> None:
    request = scrapy.Request(url)
    fp = request_fingerprint(request)
    assert request._meta is None  # (Scrapy makes the dict on first use of .meta)
    assert fp == scrapy_fingerprint(request)


@pytest.mark.parametrize("url", URLS)
def test_fingerprint_reads_meta_when_there_is_one(url: str) -> None:
    verbatim = scrapy.Request(url, meta={"verbatim_url": True})
    assert request_fingerprint(verbatim) == scrapy_fingerprint(verbatim)
    versioned = scrapy.Request(url, meta={"v": 3})
    assert request_fingerprint(versioned, version_meta_key="v") != request_fingerprint(versioned)
    assert request_fingerprint(versioned, version_meta_key="v") == request_fingerprint(
        scrapy.Request(url, meta={"v": "3"}), version_meta_key="v"
    )
    empty = scrapy.Request(url, meta={"v": None})
    assert request_fingerprint(empty, version_meta_key="v") == request_fingerprint(empty)


def test_digest_is_the_json_scrapy_hashes() -> None:
    import json

    for headers, version in (("{}", None), (None, None), ("{}", "v1"), (None, "\u00e9")):
        doc: dict[str, object] = {"body": "6b", "method": "GET", "url": "http://a/"}
        if headers is not None:
            doc["headers"] = {}
        if version is not None:
            doc["version"] = version
        text = json.dumps(doc, sort_keys=True)
        assert (
            _digest("http://a/", "GET", b"k", headers, version)
            == hashlib.sha1(text.encode()).digest()
        )


@pytest.mark.parametrize("key", [None, "example.com", "bücher.example", "K3:a|b", ""])
def test_record_with_its_stamp_in_one_piece(key: str | None) -> None:
    env = Envelope(url="http://example.com/a", callback="parse", priority=-2)
    stamp = push_stamp(1_764_000_000_123)
    whole = record(env, key, stamp)
    assert whole == record(env, key) + stamp
    assert push_time(whole) == 1_764_000_000.123
    assert parse_record(whole)[:3] == (-2, 0, "")
    assert record_key(whole) == key
    assert from_record(whole) == from_record(record(env, key)) == env
    if key is not None:  # a record whose slot went back at response time (``k``)
        freed = whole.replace(b"||K", b"||k", 1)
        assert from_record(freed) == env and parse_record(freed)[3] == parse_record(whole)[3]
