"""A RedisSpider whose start entries the test writes to Redis: it records every response
(URL, ``meta["source"]``, ``dont_filter``, which callback) and, the first time ``parse``
runs, pushes ``-a idle_url=...`` onto its own start key, so that entry is read while the
spider is idle. ``allowed_domains`` does not include the test site: start entries must be
fetched anyway (scrapy-redis's behaviour), links they yield must not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy

from redcrawl.scrapy import RedisSpider


class StartEntries(RedisSpider):
    name = "start_entries"
    allowed_domains = ["example.com"]
    max_idle_time = 1.5
    custom_settings = {"EXTENSIONS": {"rc_testkit.Report": 500}}

    def __init__(self, idle_url: str = "", offsite_link: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.idle_url = idle_url
        self.offsite_link = offsite_link
        self.report: dict[str, Any] = {"seen": [], "pushed": False}

    def _record(self, response: scrapy.http.Response, callback: str) -> None:
        assert response.request is not None
        self.report["seen"].append(
            [response.url, response.meta.get("source"), response.request.dont_filter, callback]
        )

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        self._record(response, "parse")
        if self.idle_url and not self.report["pushed"]:
            self.report["pushed"] = True
            assert self.redis_key is not None
            self.server.lpush(self.redis_key, self.idle_url)
        if self.offsite_link:  # an ordinary request: offsite, so Scrapy drops it
            yield scrapy.Request(self.offsite_link, callback=self.parse_item)

    def parse_item(self, response: scrapy.http.Response) -> None:
        self._record(response, "parse_item")
