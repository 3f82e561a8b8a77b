"""A RedisSpider that only fetches its start entries (tests/test_start_claim_kill.py):
what is fetched is counted at the test site, so an entry lost between its key and the
frontier shows as a page never served. ``REDCRAWL_MAX_IDLE_TIME`` says how long it waits
for more entries."""

from __future__ import annotations

import scrapy

from redcrawl.scrapy import RedisSpider


class StartClaim(RedisSpider):
    name = "start_claim"
    custom_settings = {"EXTENSIONS": {"rc_testkit.Report": 500}}

    def parse(self, response: scrapy.http.Response) -> None:
        return None
