"""The demo shop (redcrawl.demo.site): pages, 404s, misbehaviour, hit counting, keep-alive,
the command line, and complete crawls (a plain breadth-first crawler and a real Scrapy
spider in a subprocess). No Redis needed."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from redcrawl.demo import ShopSite, SiteConfig, canonical_path


@pytest.fixture
def site() -> Iterator[ShopSite]:
    with ShopSite(SiteConfig(products=95, per_page=4, categories=4)) as s:
        yield s


def _get(site: ShopSite, target: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    try:
        conn.request(method, target)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href is not None:
            self.hrefs.append(href)


def _links(body: bytes) -> list[str]:
    parser = _Links()
    parser.feed(body.decode("utf-8"))
    parser.close()
    return parser.hrefs


def _ld(body: bytes) -> dict[str, Any]:
    match = re.search(rb'<script type="application/ld\+json">(.*?)</script>', body)
    assert match is not None
    data: dict[str, Any] = json.loads(match[1])
    return data


def _strip_tracking(target: str) -> str:
    parts = urlsplit(target)
    query = [
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if not (k.startswith("utm_") or k == "ref")
    ]
    return urlunsplit(parts._replace(query=urlencode(query), fragment=""))


def _crawl(site: ShopSite, *, strip: bool) -> dict[str, int]:
    """Breadth-first crawl from ``/`` over one keep-alive connection, following every link
    (tracking parameters stripped or not): ``{target: status}`` of every target fetched."""
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    fetched: dict[str, int] = {}
    seen, queue = {"/"}, deque(["/"])
    with contextlib.closing(conn):
        while queue:
            target = queue.popleft()
            conn.request("GET", target)
            response = conn.getresponse()
            body = response.read()
            fetched[target] = response.status
            for href in _links(body):
                assert href.startswith("/"), href  # root-relative, on this site
                link = _strip_tracking(href) if strip else href
                if link not in seen:
                    seen.add(link)
                    queue.append(link)
    return fetched


# -- configuration ----------------------------------------------------------------------


def test_config_pages_and_demo() -> None:
    demo = SiteConfig.demo()
    assert (demo.products, demo.slow_every, demo.error_every, demo.throttle_every) == (
        3000,
        97,
        53,
        71,
    )
    assert demo.always_fail == (1234,) and demo.tracking_params
    assert demo.pages == 1 + 10 * 15 + 3000 == 3151
    for config in (
        SiteConfig(),
        demo,
        SiteConfig(products=95, per_page=4, categories=4),
        SiteConfig(products=3, categories=5),
        SiteConfig(products=0),
        SiteConfig(products=20, per_page=20, categories=1),
    ):
        pages = ShopSite(config).canonical_pages()
        assert len(pages) == config.pages
        assert "/" in pages and "/category/1?page=1" in pages
        assert sum(p.startswith("/product/") for p in pages) == config.products
    # categories 4 and 5 are empty but still have a (linked) page 1
    assert ShopSite(SiteConfig(products=3, categories=5)).canonical_pages() == {
        "/",
        *(f"/category/{c}?page=1" for c in range(1, 6)),
        "/product/1",
        "/product/2",
        "/product/3",
    }
    assert ShopSite(SiteConfig(products=7)).product_ids() == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    "field",
    [
        "products",
        "slow_every",
        "error_every",
        "throttle_every",
        "flaky_failures",
        "links_per_page",
        "slow_delay",
    ],
)
def test_config_rejects_negatives(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        bad: dict[str, Any] = {field: -1}
        SiteConfig(**bad)


@pytest.mark.parametrize("field", ["per_page", "categories"])
def test_config_rejects_zero(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        bad: dict[str, Any] = {field: 0}
        SiteConfig(**bad)


def test_canonical_path() -> None:
    assert canonical_path("/") == "/"
    assert canonical_path("/?ref=x&utm_source=y") == "/"
    assert canonical_path("/product/7?utm_source=a&utm_medium=b") == "/product/7"
    assert canonical_path("/product/7?ref=cat3#top") == "/product/7"
    assert canonical_path("/category/3?ref=next&page=2") == "/category/3?page=2"
    assert canonical_path("/category/3?page=2&utm_source=home") == "/category/3?page=2"
    assert canonical_path("/category/3") == "/category/3?page=1"
    assert canonical_path("http://127.0.0.1:8000/product/9?ref=x") == "/product/9"


# -- serving ----------------------------------------------------------------------------


def test_start_stop_free_port_and_restart() -> None:
    site = ShopSite(SiteConfig(products=5))
    with pytest.raises(RuntimeError):
        _ = site.url
    assert site.start() is site and site.running
    assert site.start() is site  # already running: no-op
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", site.url)
    assert site.url.endswith(f":{site.port}") and site.port > 0
    port = site.port
    assert _get(site, "/")[0] == 200
    site.stop()
    site.stop()  # idempotent
    assert not site.running
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).connect()
    # the port can be bound again at once, and a stopped site can start again
    with ShopSite(SiteConfig(products=5), port=port) as again:
        assert again.port == port and _get(again, "/product/5")[0] == 200
    site.start()
    assert _get(site, "/product/1")[0] == 200
    site.stop()


def test_keep_alive_and_stop_closes_connections(site: ShopSite) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    with contextlib.closing(conn):
        sock = None
        for target in ("/", "/category/1?page=1", "/product/1", "/product/9999", "/"):
            conn.request("GET", target)
            response = conn.getresponse()
            body = response.read()
            assert int(response.getheader("Content-Length", "-1")) == len(body)
            assert response.getheader("Connection") is None  # HTTP/1.1: persistent
            assert not response.will_close
            sock = sock or conn.sock
            assert conn.sock is sock  # the same connection served every request
        conn.request("HEAD", "/product/2")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b""
        assert int(response.getheader("Content-Length", "0")) > 0
        site.stop()
        with pytest.raises(OSError):  # ConnectionError / RemoteDisconnected
            conn.request("GET", "/")
            conn.getresponse().read()


def test_connection_close_and_unknown_method(site: ShopSite) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    with contextlib.closing(conn):
        conn.request("GET", "/", headers={"Connection": "close"})
        response = conn.getresponse()
        assert response.getheader("Connection") == "close" and response.will_close
        response.read()
    assert _get(site, "/", method="POST")[0] == 501


def test_home_page(site: ShopSite) -> None:
    status, headers, body = _get(site, "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert body.startswith(b"<!DOCTYPE html>")
    links = _links(body)
    assert {_strip_tracking(h) for h in links if "/category/" in h} == {
        f"/category/{c}?page=1" for c in range(1, 5)
    }
    featured = [h for h in links if h.startswith("/product/")]
    assert len(featured) == 5 and all("?" in h for h in featured)  # all with tracking
    assert len({_strip_tracking(h) for h in featured}) == 5


def test_category_page_and_pagination(site: ShopSite) -> None:
    # category 2 of 95 products in 4 categories: 2, 6, 10, ..., 94 (24 products, 6 pages)
    status, _, body = _get(site, "/category/2?page=2")
    assert status == 200
    text = body.decode()
    assert "Garden &amp; Patio" in text and "page 2 of 6" in text
    links = _links(body)
    products = [h for h in links if h.startswith("/product/")]
    assert {_strip_tracking(h) for h in products} == {f"/product/{p}" for p in (18, 22, 26, 30)}
    assert len(products) > 4  # duplicate links to the same products
    assert any("utm_source=listing" in h for h in products)
    assert any("ref=cat2" in h for h in products)
    pager = [h for h in links if h.startswith("/category/")]
    assert {_strip_tracking(h) for h in pager} == {f"/category/2?page={n}" for n in range(1, 7)}
    assert "/category/2?page=1" in pager  # prev
    assert "/category/2?page=3&ref=next" in pager  # next, with tracking
    first, last = _get(site, "/category/2?page=1")[2], _get(site, "/category/2?page=6")[2]
    assert b'rel="prev"' not in first and b'rel="next"' in first
    assert b'rel="next"' not in last and b'rel="prev"' in last
    assert {_strip_tracking(h) for h in _links(last) if h.startswith("/product/")} == {
        "/product/82",
        "/product/86",
        "/product/90",
        "/product/94",
    }
    # category 4 holds 23 products: its last page is not full
    short = _get(site, "/category/4?page=6")[2]
    assert b"page 6 of 6" in short
    assert {_strip_tracking(h) for h in _links(short) if h.startswith("/product/")} == {
        "/product/84",
        "/product/88",
        "/product/92",
    }
    # a page without ?page= is page 1
    assert _get(site, "/category/2")[2] == first


def test_product_page(site: ShopSite) -> None:
    status, _, body = _get(site, "/product/17")
    assert status == 200
    text = body.decode()
    ld = _ld(body)
    assert ld["@type"] == "Product" and ld["sku"] == "SKU-000017" == site.expected_sku(17)
    assert re.search(r'class="sku">SKU-000017<', text)
    assert f'class="product-name">{ld["name"]}<' in text
    assert re.fullmatch(r"\d+\.\d\d", ld["offers"]["price"])
    assert f'class="price" data-currency="EUR">{ld["offers"]["price"]}<' in text
    assert ld["category"] == "Home & Kitchen"  # 17 -> category 1
    assert 'class="category" href="/category/1?page=1">Home &amp; Kitchen<' in text
    links = _links(body)
    related = [h for h in links if h.startswith("/product/")]
    assert len(related) == 3 and len({_strip_tracking(h) for h in related}) == 3
    assert "/product/17" not in {_strip_tracking(h) for h in related}
    # back to the listing page that lists it: category 1 holds 1, 5, 9, 13 | 17, ...
    assert "/category/1?page=2&ref=breadcrumb" in links and "/" in links
    # names, prices and skus are stable and skus unique
    again = ShopSite(site.config).start()
    try:
        assert _get(again, "/product/17")[2] == body
    finally:
        again.stop()
    assert len({_ld(_get(site, f"/product/{p}")[2])["name"] for p in range(1, 96)}) == 95
    cafe = _get(site, "/product/4")[2].decode("utf-8")  # category 4: non-ASCII name
    assert "Café Supplies" in cafe


@pytest.mark.parametrize(
    "target",
    [
        "/product/0",
        "/product/96",
        "/product/abc",
        "/product/017",
        "/product/",
        "/product/1/x",
        "/category/0?page=1",
        "/category/5?page=1",
        "/category/1?page=0",
        "/category/1?page=7",
        "/category/1?page=x",
        "/category/x?page=1",
        "/category/1?page=",
        "/nope",
        "/products/1",
        "/product/" + "9" * 5000,
    ],
)
def test_not_found(site: ShopSite, target: str) -> None:
    status, headers, body = _get(site, target)
    assert status == 404 and b"404 Not Found" in body
    assert int(headers["Content-Length"]) == len(body)


def test_robots_txt(site: ShopSite) -> None:
    status, headers, body = _get(site, "/robots.txt")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert b"Allow: /" in body
    assert "/robots.txt" not in site.canonical_pages()


# -- misbehaviour ------------------------------------------------------------------------


def test_flaky_errors_throttling_and_poison_pages() -> None:
    config = SiteConfig(
        products=30, error_every=4, throttle_every=6, flaky_failures=2, always_fail=(3, 5)
    )
    with ShopSite(config) as site:

        def statuses(p: int, n: int = 4) -> list[int]:
            return [_get(site, f"/product/{p}")[0] for _ in range(n)]

        assert statuses(4) == [500, 500, 200, 200]
        assert statuses(12) == [500, 500, 200, 200]  # error and throttle: 500 wins
        assert statuses(1) == [200] * 4
        assert statuses(3, 6) == [500] * 6 and statuses(5) == [500] * 4
        status, headers, body = _get(site, "/product/6")
        assert status == 429 and headers["Retry-After"] == "1" and b"429" in body
        assert _get(site, "/product/6")[0] == 429 and _get(site, "/product/6")[0] == 200
        # failures count per canonical path: tracking variants share the count
        assert _get(site, "/product/8?utm_source=listing&utm_medium=web")[0] == 500
        assert _get(site, "/product/8?ref=cat4")[0] == 500
        assert _get(site, "/product/8")[0] == 200
        # reset_hits keeps the failure counts; reset_failures makes flaky pages fail again
        site.reset_hits()
        assert _get(site, "/product/4")[0] == 200
        site.reset_failures()
        assert _get(site, "/product/4")[0] == 500
        # listing pages and the home page never fail
        assert _get(site, "/")[0] == 200 and _get(site, "/category/4?page=1")[0] == 200


def test_slow_pages() -> None:
    with ShopSite(SiteConfig(products=10, slow_every=3, slow_delay=0.3)) as site:
        for target in ("/product/3", "/product/6?utm_source=x"):
            t0 = time.perf_counter()
            assert _get(site, target)[0] == 200
            assert time.perf_counter() - t0 >= 0.3
        t0 = time.perf_counter()
        assert _get(site, "/product/4")[0] == 200
        assert time.perf_counter() - t0 < 0.3  # others are not slowed


# -- hits ---------------------------------------------------------------------------------


def test_hits_are_canonical(site: ShopSite) -> None:
    assert site.hits() == {}
    for target in (
        "/product/5?utm_source=a&utm_medium=b",
        "/product/5?ref=x",
        "/product/5",
        "/category/2?page=1&utm_source=home",
        "/category/2?ref=a&page=1",
        "/category/2",
        "/?ref=x",
        "/",
        "/product/96",
    ):
        _get(site, target)
    assert site.hits() == {"/product/5": 3, "/category/2?page=1": 3, "/": 2, "/product/96": 1}
    hits = site.hits()
    hits.clear()  # a copy
    assert site.hits()["/"] == 2
    site.reset_hits()
    assert site.hits() == {}


# -- complete crawls ----------------------------------------------------------------------


def test_complete_crawl_stripping_tracking_params_fetches_exactly_canonical_pages() -> None:
    config = SiteConfig(products=230, per_page=7, categories=4)
    with ShopSite(config) as site:
        fetched = _crawl(site, strip=True)
        assert set(fetched) == site.canonical_pages()
        assert set(fetched.values()) == {200}
        assert site.hits() == dict.fromkeys(site.canonical_pages(), 1)


def test_naive_crawl_sees_duplicates_of_the_same_pages() -> None:
    config = SiteConfig(products=230, per_page=7, categories=4)
    with ShopSite(config) as site:
        fetched = _crawl(site, strip=False)
        assert len(fetched) > 1.5 * config.pages  # tracking variants fetched again
        assert {canonical_path(t) for t in fetched} == site.canonical_pages()
        assert set(site.hits()) == site.canonical_pages()
        assert sum(site.hits().values()) == len(fetched)
        assert any(n > 1 for n in site.hits().values())


def test_bench_mode_extra_links_and_no_tracking() -> None:
    config = SiteConfig(
        products=120, per_page=6, categories=3, links_per_page=15, tracking_params=False
    )
    with ShopSite(config) as site:
        for target in ("/", "/category/2?page=3", "/product/50"):
            body = _get(site, target)[2]
            assert body.count(b'class="more-link"') == 15
            links = _links(body)
            assert not [h for h in links if "utm_" in h or "ref=" in h]
            assert set(links) <= site.canonical_pages()
        assert _get(site, "/product/50")[2] == _get(site, "/product/50")[2]  # deterministic
        fetched = _crawl(site, strip=False)  # nothing to strip
        assert set(fetched) == site.canonical_pages()
    with ShopSite(dataclasses.replace(config, tracking_params=True)) as site:
        assert set(_crawl(site, strip=True)) == site.canonical_pages()


# -- a real Scrapy crawl ------------------------------------------------------------------

SPIDER = r"""
import json
import sys
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import scrapy
from scrapy.crawler import CrawlerProcess


def clean(url):
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if not (k.startswith("utm_") or k == "ref")]
    return urlunsplit(parts._replace(query=urlencode(query), fragment=""))


class ShopSpider(scrapy.Spider):
    name = "shop"

    async def start(self):
        # not start_urls: those are dont_filter=True, so "/" would be fetched again
        yield scrapy.Request(self.url + "/")

    def parse(self, response):
        ld = response.css('script[type="application/ld+json"]::text').get()
        if ld is not None:
            data = json.loads(ld)
            yield {
                "sku": data["sku"], "name": data["name"], "category": data["category"],
                "price": data["offers"]["price"],
                "css": [response.css(".product .sku::text").get(),
                        response.css(".product .product-name::text").get(),
                        response.css(".product .category::text").get(),
                        response.css(".product .price::text").get()],
            }
        for href in response.css("a::attr(href)").getall():
            yield scrapy.Request(clean(response.urljoin(href)))


url, items, stats = sys.argv[1:4]
process = CrawlerProcess(settings={
    "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
    "RETRY_ENABLED": True,
    "RETRY_TIMES": 3,
    "RETRY_HTTP_CODES": [429, 500],
    "FEEDS": {items: {"format": "jsonlines"}},
})
crawler = process.create_crawler(ShopSpider)
process.crawl(crawler, url=url)
process.start()
with open(stats, "w") as f:
    json.dump(crawler.stats.get_stats(), f, default=str)
"""


@pytest.mark.timeout(60)
def test_scrapy_crawl_fetches_every_canonical_page(tmp_path: Path) -> None:
    config = SiteConfig(products=200, error_every=7, throttle_every=11, always_fail=(5,))
    items_file, stats_file = tmp_path / "items.jsonl", tmp_path / "stats.json"
    with ShopSite(config) as site:
        proc = subprocess.run(
            [sys.executable, "-c", SPIDER, site.url, str(items_file), str(stats_file)],
            capture_output=True,
            text=True,
            timeout=50,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        hits = site.hits()

    items = [json.loads(line) for line in items_file.read_text().splitlines()]
    skus = {item["sku"] for item in items}
    assert len(skus) == len(items) == 199
    assert skus == {f"SKU-{p:06d}" for p in range(1, 201) if p != 5}
    for item in items:  # CSS classes agree with the JSON-LD block
        assert item["css"] == [item["sku"], item["name"], item["category"], item["price"]]

    # every canonical page fetched; once each, plus the retries of failing pages
    assert set(hits) == site.canonical_pages()
    expected = dict.fromkeys(site.canonical_pages(), 1)
    flaky = [p for p in site.product_ids() if p % 7 == 0 or p % 11 == 0]
    expected.update({f"/product/{p}": 2 for p in flaky})
    expected["/product/5"] = 1 + 3  # the poison page: first try and 3 retries
    assert hits == expected

    stats = json.loads(stats_file.read_text())
    assert stats["retry/max_reached"] == 1
    assert stats["downloader/response_status_count/429"] == len([p for p in flaky if p % 7 != 0])
    assert (
        stats["downloader/response_status_count/500"] == len([p for p in flaky if p % 7 == 0]) + 4
    )
    assert stats["item_scraped_count"] == 199


# -- command line -------------------------------------------------------------------------


def test_command_line_serves_until_interrupted() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-W",
            "error",
            "-m",
            "redcrawl.demo.site",
            "--port",
            "0",
            "--products",
            "12",
            "--per-page",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"\((\d+) pages\) at http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        assert int(match[1]) == SiteConfig(products=12, per_page=5).pages
        conn = http.client.HTTPConnection("127.0.0.1", int(match[2]), timeout=10)
        with contextlib.closing(conn):
            conn.request("GET", "/product/12")
            assert conn.getresponse().status == 200
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
        assert proc.returncode == 0, stderr
        assert stderr == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
