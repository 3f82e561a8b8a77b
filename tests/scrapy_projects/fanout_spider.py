"""The start page (``-a url=<site>``; none with ``-a start=0``) links to one slow page
(``-a slow=<path>``), whose callback yields ``-a leaves=<n>`` more pages
(``/product/1`` .. ``/product/<n>``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy


class Fanout(scrapy.Spider):
    name = "fanout"
    custom_settings = {"EXTENSIONS": {"rc_testkit.Report": 500}}

    def __init__(
        self,
        url: str = "",
        start: str = "1",
        slow: str = "/product/60",
        leaves: str = "50",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.base = url
        self.slow = slow
        self.leaves = int(leaves)
        self.start_urls = [url + "/"] if start == "1" else []

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        yield scrapy.Request(self.base + self.slow, callback=self.parse_slow)

    def parse_slow(self, response: scrapy.http.Response) -> Iterator[Any]:
        for i in range(1, self.leaves + 1):
            yield scrapy.Request(f"{self.base}/product/{i}", callback=self.parse_leaf)

    def parse_leaf(self, response: scrapy.http.Response) -> Iterator[Any]:
        yield {"url": response.url}
