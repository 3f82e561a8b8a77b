"""Requests whose meta holds values that are not plain data (an Item, a dataclass, a
datetime, a Decimal, a set, a tuple), through redcrawl's scheduler and Redis: the callback
records what it received (type names and reprs) in ``report["got"]``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
from collections.abc import Iterator
from typing import Any

import scrapy


class Product(scrapy.Item):
    name = scrapy.Field()
    tags = scrapy.Field()


@dataclasses.dataclass(frozen=True)
class Offer:
    price: decimal.Decimal
    until: dt.date


META: dict[str, Any] = {
    "item": Product(name="Lamp", tags=("a", "b")),
    "offer": Offer(decimal.Decimal("9.90"), dt.date(2030, 1, 2)),
    "when": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC),
    "seen": {1, 2},
    "pair": (1, (2, 3)),
    "price": decimal.Decimal("1.10"),
}


class MetaTypes(scrapy.Spider):
    name = "meta_types"
    custom_settings = {"EXTENSIONS": {"rc_testkit.Report": 500}}

    def __init__(self, url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url + "/"]
        self.base = url
        self.report: dict[str, Any] = {"got": []}

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        for i in (1, 2):
            yield scrapy.Request(
                f"{self.base}/product/{i}",
                callback=self.parse_product,
                meta=dict(META),
                cb_kwargs={"pair": (i, "x")},
            )

    def parse_product(self, response: scrapy.http.Response, pair: Any) -> None:
        got = {k: [type(response.meta[k]).__name__, repr(response.meta[k])] for k in META}
        got["cb_pair"] = [type(pair).__name__, repr(pair)]
        self.report["got"].append(got)
        self.report["equal"] = all(response.meta[k] == v for k, v in META.items())
