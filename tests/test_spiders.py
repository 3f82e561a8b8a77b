"""RedisSpider's start entries: parsing, and what a start entry may name."""

from __future__ import annotations

import json
from typing import Any

import pytest
import scrapy

from redcrawl.scrapy import RedisSpider


class Shop(RedisSpider):
    name = "shop"

    def parse_item(self, response: Any) -> None: ...

    def _private(self, response: Any) -> None: ...


def entry(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def test_plain_url_and_json_entries() -> None:
    spider = Shop()
    plain = spider.make_request_from_data(b"https://a.example/1\n")
    assert isinstance(plain, scrapy.Request) and plain.url == "https://a.example/1"
    req = spider.make_request_from_data(
        entry(
            url="https://a.example/2",
            meta={"k": 1},
            callback="parse_item",
            priority=5,
            method="post",
            dont_filter=False,
        )
    )
    assert isinstance(req, scrapy.Request)
    assert (req.meta["k"], req.callback, req.priority, req.method, req.dont_filter) == (
        1,
        spider.parse_item,
        5,
        "POST",
        False,
    )
    form = spider.make_request_from_data(entry(url="https://a.example/3", q="x"))
    assert isinstance(form, scrapy.FormRequest) and form.url.endswith("?q=x")
    assert spider.make_request_from_data(b"   ") is None


@pytest.mark.parametrize(
    "name",
    [
        "_private",
        "__init__",
        "setup_redis",
        "close",
        "schedule_next_requests",
        "start_requests",
        "nope",
    ],
)
def test_entries_cannot_name_anything_but_the_spiders_own_methods(name: str) -> None:
    with pytest.raises(ValueError, match="own class"):
        Shop().make_request_from_data(entry(url="https://a.example/", callback=name))


def test_entry_without_url_is_an_error() -> None:
    with pytest.raises(ValueError, match="url"):
        Shop().make_request_from_data(entry(meta={}))
