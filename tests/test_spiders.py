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


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"meta": "x"}, "'meta' must be a JSON object"),
        ({"meta": [1, 2]}, "'meta' must be a JSON object"),
        ({"cb_kwargs": 3}, "'cb_kwargs' must be a JSON object"),
        ({"headers": ["a"]}, "'headers' must be a JSON object"),
        ({"cookies": 7}, "'cookies' must be a JSON object or a list of objects"),
        ({"cookies": [1]}, "'cookies' must be a JSON object or a list of objects"),
        ({"dont_filter": "no"}, "'dont_filter' must be true or false"),
        ({"priority": "high"}, "'priority' must be an integer"),
        ({"priority": 1.5}, "'priority' must be an integer"),
        ({"priority": True}, "'priority' must be an integer"),
        ({"method": 5}, "'method' must be a string"),
        ({"body": {"a": 1}}, "'body' must be a string"),
        ({"url": 5}, "'url' must be a string"),
        ({"callback": 5}, "'callback' must be a string"),
    ],
)
def test_an_entry_field_of_the_wrong_type_is_refused_naming_it(
    fields: dict[str, Any], named: str
) -> None:
    """An outside tester's entries: '"meta": "x"' was refused as "dictionary update
    sequence element #0 has length 1; 2 is required", '"cookies": 7' was accepted and
    failed at download (retried, then dead-lettered instead of refused), and
    '"dont_filter": "no"' counted as true."""
    with pytest.raises(ValueError, match=named):
        Shop().make_request_from_data(entry(**{"url": "https://a.example/", **fields}))


def test_entry_fields_of_the_right_types_still_pass() -> None:
    req = Shop().make_request_from_data(
        entry(
            url="https://a.example/",
            meta={},
            cb_kwargs={"a": 1},
            headers={"X-A": "1", "X-B": ["2", "3"]},
            cookies=[{"name": "a", "value": "1"}],
            dont_filter=False,
            priority=-3,
            method="put",
            body="x=1",
        )
    )
    assert isinstance(req, scrapy.Request)
    assert (req.priority, req.method, req.body, req.dont_filter) == (-3, "PUT", b"x=1", False)
    cookies = Shop().make_request_from_data(entry(url="https://a.example/", cookies={"a": "1"}))
    assert isinstance(cookies, scrapy.Request) and cookies.cookies == {"a": "1"}
    nulls = Shop().make_request_from_data(
        entry(url="https://a.example/", meta=None, callback=None, dont_filter=None)
    )  # null is "not given", as before
    assert isinstance(nulls, scrapy.Request) and nulls.dont_filter and nulls.callback is None
