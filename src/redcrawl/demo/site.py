"""A deterministic local test web site, "a shop", for crawl demos, end-to-end tests and
benchmarks.

The site is served on loopback by the standard library alone (a
:class:`~http.server.ThreadingHTTPServer`, HTTP/1.1 keep-alive with ``Content-Length``)
and every page is a pure function of its URL and the :class:`SiteConfig`, so two sites
with the same configuration serve byte-identical pages. Its pages:

``/``
    The home page: links to page 1 of every category and to a few "featured" products.
``/category/<c>?page=<n>``
    Listing page *n* of category *c* (``1 <= c <= categories``): links to its products
    (``/product/<id>``, each product linked twice or more), "prev"/"next" links and links
    to every page ``1..last`` of the category. Product *p* is in category
    ``(p - 1) % categories + 1``; a category's products are listed ``per_page`` a page, in
    id order, and an empty category still has page 1. Other pages answer 404.
``/product/<id>``
    Product *id* (``1 <= id <= products``): name, price, SKU (``SKU-000017``) and
    category, in the CSS classes ``product-name``, ``price``, ``sku`` and ``category``
    and in a ``<script type="application/ld+json">`` schema.org ``Product`` block. Links
    to three related products, to its listing page and to the home page. Other ids
    answer 404.
``/robots.txt``
    Allows everything (not linked, and not one of :meth:`ShopSite.canonical_pages`).

Links are root-relative. With ``tracking_params`` (the default) many of them carry
tracking parameters (``utm_*`` and ``ref``), so a crawler that deduplicates raw URLs
fetches the same page several times, while one that strips those parameters (see
:func:`canonical_path`) fetches exactly :meth:`ShopSite.canonical_pages`: every page is
reachable from ``/``, and no link leads outside that set. With ``links_per_page > 0``
(bench mode, like ``scrapy bench``) every page also links to that many pseudo-random
pages of the site, chosen deterministically from the page's own path; across a crawl
nearly all of them are duplicates.

Product pages can misbehave, each rule counting requests per canonical path (so tracking
variants share a count): every ``slow_every``-th product sleeps ``slow_delay`` seconds
before answering; every ``error_every``-th answers 500 and every ``throttle_every``-th
answers 429 (``Retry-After: 1``) to its first ``flaky_failures`` requests (500 wins when
both apply), then 200; products in ``always_fail`` always answer 500 (poison pages).

Use it from tests::

    with ShopSite(SiteConfig(products=200, error_every=7)) as site:
        ...  # crawl site.url, then inspect site.hits()

or from a shell: ``python -m redcrawl.demo.site --port 8000 --demo``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import html
import json
import socket
import socketserver
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple
from urllib.parse import parse_qsl, urlsplit

__all__ = [
    "DEFAULT_CONFIG",
    "ShopSite",
    "SiteConfig",
    "canonical_path",
    "is_tracking_param",
    "main",
]


def is_tracking_param(name: str) -> bool:
    """True for the query parameters the site uses for tracking: ``utm_*`` and ``ref``."""
    return name.startswith("utm_") or name == "ref"


def canonical_path(target: str) -> str:
    """The canonical form of a request target (``/path?query``, or an absolute URL): the
    path alone, except that ``/category/...`` keeps its ``page`` parameter (``?page=1`` when
    absent). Tracking and any other parameters are dropped. This is the key of
    :meth:`ShopSite.hits`."""
    parts = urlsplit(target)
    path = parts.path or "/"
    if not path.startswith("/category/"):
        return path
    page = "1"
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "page":
            page = value
            break
    return f"{path}?page={page}"


@dataclass(frozen=True, kw_only=True)
class SiteConfig:
    """The shape and misbehaviour of a :class:`ShopSite` (see the module docstring)."""

    products: int = 2000
    """Product pages ``/product/1`` .. ``/product/<products>``."""
    per_page: int = 20
    """Products per listing page."""
    categories: int = 10
    """Categories ``/category/1`` .. ``/category/<categories>``."""
    slow_every: int = 0
    """Every Nth product page sleeps ``slow_delay`` seconds before answering (0 = none)."""
    slow_delay: float = 0.5
    error_every: int = 0
    """Every Nth product page answers 500 to its first ``flaky_failures`` requests."""
    throttle_every: int = 0
    """Every Nth product page answers 429 (``Retry-After: 1``) to its first
    ``flaky_failures`` requests."""
    flaky_failures: int = 1
    always_fail: tuple[int, ...] = ()
    """Product ids that always answer 500 (poison pages)."""
    tracking_params: bool = True
    """Links carry ``utm_*`` / ``ref`` variants, so naive dedupe sees duplicates."""
    links_per_page: int = 0
    """Bench mode: every page also links to this many pseudo-random pages of the site."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "always_fail", tuple(int(p) for p in self.always_fail))
        for name in ("products", "slow_every", "error_every", "throttle_every",
                     "flaky_failures", "links_per_page"):
            if getattr(self, name) < 0:
                raise ValueError(f"SiteConfig.{name} must be >= 0")
        for name in ("per_page", "categories"):
            if getattr(self, name) < 1:
                raise ValueError(f"SiteConfig.{name} must be >= 1")
        if self.slow_delay < 0:
            raise ValueError("SiteConfig.slow_delay must be >= 0")

    @classmethod
    def demo(cls) -> SiteConfig:
        """Several thousand pages (3151) with every kind of misbehaviour."""
        return cls(products=3000, slow_every=97, error_every=53, throttle_every=71,
                   always_fail=(1234,), tracking_params=True)

    def category_of(self, product: int) -> int:
        """The category of a product."""
        return (product - 1) % self.categories + 1

    def category_size(self, category: int) -> int:
        """The number of products in a category."""
        return len(range(category, self.products + 1, self.categories))

    def category_pages(self, category: int) -> int:
        """The number of listing pages of a category (at least 1)."""
        return max(1, -(-self.category_size(category) // self.per_page))

    def listing_page_of(self, product: int) -> int:
        """The listing page of its category that lists a product."""
        return (product - 1) // self.categories // self.per_page + 1

    @property
    def pages(self) -> int:
        """The number of distinct canonical pages: home + listing pages + product pages."""
        listing = sum(self.category_pages(c) for c in range(1, self.categories + 1))
        return 1 + listing + self.products


DEFAULT_CONFIG = SiteConfig()

_ADJECTIVES = ("Sturdy", "Elegant", "Compact", "Rustic", "Vintage", "Sleek", "Cozy", "Rugged",
               "Classic", "Modern", "Deluxe", "Handmade", "Portable", "Bright", "Quiet", "Smart")
_MATERIALS = ("Oak", "Steel", "Linen", "Ceramic", "Bamboo", "Copper", "Wool", "Glass",
              "Leather", "Marble", "Cotton")
_NOUNS = ("Lamp", "Chair", "Mug", "Backpack", "Kettle", "Blanket", "Clock", "Notebook", "Vase",
          "Speaker", "Jacket", "Bowl", "Shelf")
_CATEGORY_NAMES = ("Home & Kitchen", "Garden & Patio", "Books", "Café Supplies", "Outdoor",
                   "Toys & Games", "Office", "Music", "Sports", "Crafts")
_FEATURED = 5
_RELATED = 3
_HTML = "text/html; charset=utf-8"


class _Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = _HTML
    headers: tuple[tuple[str, str], ...] = ()


def _numbers(seed: str) -> Iterator[int]:
    """Deterministic pseudo-random 31-bit numbers from a string seed (a 64-bit LCG: the
    same on every platform and Python version, and cheap)."""
    x = zlib.crc32(seed.encode())
    while True:
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFF_FFFF_FFFF_FFFF
        yield x >> 33


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _document(title: str, body: str, *, kind: str, head: str = "") -> bytes:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_esc(title)}</title>\n{head}</head>\n"
        f'<body class="{kind}">\n{body}</body>\n</html>\n'
    ).encode()


class _Shop:
    """The site's pages and request counters, independent of the HTTP server."""

    def __init__(self, config: SiteConfig) -> None:
        self.config = config
        c = config
        self.listing_pages: list[str] = [
            f"/category/{cat}?page={n}"
            for cat in range(1, c.categories + 1)
            for n in range(1, c.category_pages(cat) + 1)
        ]
        self.pages = c.pages
        self.always_fail = frozenset(c.always_fail)
        self.lock = threading.Lock()
        self.hits: Counter[str] = Counter()
        self.product_requests: Counter[int] = Counter()

    # -- names and values -------------------------------------------------------------

    @staticmethod
    def product_name(p: int) -> str:
        # 16, 11 and 13 are pairwise coprime: names are unique for ids below 2288.
        return f"{_ADJECTIVES[p % 16]} {_MATERIALS[p % 11]} {_NOUNS[p % 13]}"

    @staticmethod
    def price(p: int) -> str:
        cents = 199 + (p * 7919) % 49_800
        return f"{cents // 100}.{cents % 100:02d}"

    @staticmethod
    def sku(p: int) -> str:
        return f"SKU-{p:06d}"

    @staticmethod
    def category_name(cat: int) -> str:
        return _CATEGORY_NAMES[cat - 1] if cat <= len(_CATEGORY_NAMES) else f"Category {cat}"

    def canonical_page(self, index: int) -> str:
        """The ``index``-th canonical page: home, listing pages, then products."""
        if index == 0:
            return "/"
        if index <= len(self.listing_pages):
            return self.listing_pages[index - 1]
        return f"/product/{index - len(self.listing_pages)}"

    def canonical_pages(self) -> set[str]:
        return {self.canonical_page(i) for i in range(self.pages)}

    def spread(self, seed: str, count: int, exclude: int = 0) -> list[int]:
        """``count`` distinct product ids other than ``exclude`` (fewer if there are not
        enough), a deterministic function of ``seed``."""
        n = self.config.products
        count = min(count, n - (1 if 1 <= exclude <= n else 0))
        picks: list[int] = []
        for x in _numbers(seed):
            if len(picks) >= count:
                break
            q = x % n + 1
            if q != exclude and q not in picks:
                picks.append(q)
        return picks

    # -- link helpers -----------------------------------------------------------------

    def track(self, href: str, params: str) -> str:
        """``href`` with tracking ``params`` appended, when tracking is on."""
        if not self.config.tracking_params or not params:
            return href
        return f"{href}{'&' if '?' in href else '?'}{params}"

    def extra_links(self, canonical: str) -> str:
        k = self.config.links_per_page
        if k <= 0:
            return ""
        numbers = _numbers(f"more:{canonical}")
        items = []
        for i in range(k):
            href = self.canonical_page(next(numbers) % self.pages)
            if i % 4 == 3:
                href = self.track(href, f"utm_source=more&utm_content=l{i}")
            href = href.replace("&", "&amp;")  # the only character to escape in our URLs
            items.append(f'<li><a class="more-link" href="{href}">more {i + 1}</a></li>')
        return ('<section class="more"><h2>More from the shop</h2><ul>\n'
                + "\n".join(items) + "\n</ul></section>\n")

    # -- pages ------------------------------------------------------------------------

    def home(self) -> _Response:
        c = self.config
        cats = []
        for cat in range(1, c.categories + 1):
            href = f"/category/{cat}?page=1"
            if cat % 2 == 0:
                href = self.track(href, "utm_source=home&utm_medium=nav")
            cats.append(f'<li><a class="category-link" href="{_esc(href)}">'
                        f"{_esc(self.category_name(cat))}</a></li>")
        featured = []
        for i, p in enumerate(self.spread("featured", _FEATURED)):
            href = self.track(f"/product/{p}", ("utm_source=home&utm_medium=featured",
                                                "ref=home")[i % 2])
            featured.append(f'<li><a class="featured-link" href="{_esc(href)}">'
                            f"{_esc(self.product_name(p))}</a></li>")
        body = (
            '<header><h1><a href="/">The Shop</a></h1></header>\n'
            '<nav class="categories"><h2>Categories</h2><ul>\n' + "\n".join(cats)
            + "\n</ul></nav>\n"
            '<section class="featured"><h2>Featured</h2><ul>\n' + "\n".join(featured)
            + "\n</ul></section>\n"
            + self.extra_links("/")
        )
        return _Response(200, _document("The Shop", body, kind="home"))

    def listing(self, cat: int, page: int) -> _Response:
        c = self.config
        last = c.category_pages(cat)
        canonical = f"/category/{cat}?page={page}"
        name = self.category_name(cat)
        first = cat + (page - 1) * c.per_page * c.categories
        stop = min(first + c.per_page * c.categories, c.products + 1)
        cards = []
        for j, p in enumerate(range(first, stop, c.categories)):
            href = self.track(f"/product/{p}", ("", "utm_source=listing&utm_medium=web",
                                                f"ref=cat{cat}")[j % 3])
            more = ""
            if j % 4 == 0:
                more_href = self.track(f"/product/{p}",
                                       "utm_source=listing&utm_medium=web&utm_content=more")
                more = f' <a class="more-info" href="{_esc(more_href)}">More info</a>'
            cards.append(
                f'<li class="product-card" data-product-id="{p}">'
                f'<a class="thumb" href="/product/{p}"><span class="img">#{p}</span></a> '
                f'<a class="product-link" href="{_esc(href)}">{_esc(self.product_name(p))}</a>'
                f' <span class="price">{self.price(p)}</span>{more}</li>'
            )
        pager = []
        if page > 1:
            pager.append(f'<a rel="prev" class="prev" href="/category/{cat}?page={page - 1}">'
                         "Previous</a>")
        for n in range(1, last + 1):
            current = ' aria-current="page"' if n == page else ""
            pager.append(f'<a class="page"{current} href="/category/{cat}?page={n}">{n}</a>')
        if page < last:
            nxt = _esc(self.track(f"/category/{cat}?page={page + 1}", "ref=next"))
            pager.append(f'<a rel="next" class="next" href="{nxt}">Next</a>')
        body = (
            '<nav class="breadcrumb"><a href="/">Home</a> &rsaquo; '
            f'<span class="category-name">{_esc(name)}</span></nav>\n'
            f'<h1>{_esc(name)} <small>page {page} of {last}</small></h1>\n'
            '<ul class="products">\n' + "\n".join(cards) + "\n</ul>\n"
            '<nav class="pagination">' + " ".join(pager) + "</nav>\n"
            + self.extra_links(canonical)
        )
        return _Response(200, _document(f"{name} - page {page} - The Shop", body,
                                        kind="listing"))

    def product(self, p: int) -> _Response:
        c = self.config
        cat = c.category_of(p)
        canonical = f"/product/{p}"
        name, price, sku, cat_name = (self.product_name(p), self.price(p), self.sku(p),
                                      self.category_name(cat))
        listing_href = self.track(f"/category/{cat}?page={c.listing_page_of(p)}",
                                  "ref=breadcrumb")
        ld = json.dumps({
            "@context": "https://schema.org",
            "@type": "Product",
            "productID": p,
            "sku": sku,
            "name": name,
            "category": cat_name,
            "offers": {"@type": "Offer", "price": price, "priceCurrency": "EUR"},
        }, ensure_ascii=False).replace("</", "<\\/")
        related = []
        for k, q in enumerate(self.spread(f"related:{p}", _RELATED, exclude=p)):
            href = self.track(f"/product/{q}", ("", "ref=related",
                                                f"utm_source=related&utm_campaign=p{p}")[k % 3])
            related.append(f'<li><a class="related-product" href="{_esc(href)}">'
                           f"{_esc(self.product_name(q))}</a></li>")
        body = (
            '<nav class="breadcrumb"><a href="/">Home</a> &rsaquo; '
            f'<a class="category-link" href="{_esc(listing_href)}">{_esc(cat_name)}</a></nav>\n'
            f'<article class="product" data-product-id="{p}">\n'
            f'<h1 class="product-name">{_esc(name)}</h1>\n'
            f'<p>SKU: <span class="sku">{sku}</span></p>\n'
            f'<p>Price: <span class="price" data-currency="EUR">{price}</span> EUR</p>\n'
            f'<p>Category: <a class="category" href="/category/{cat}?page=1">'
            f"{_esc(cat_name)}</a></p>\n"
            "</article>\n"
            '<section class="related"><h2>Related products</h2><ul>\n'
            + "\n".join(related) + "\n</ul></section>\n"
            + self.extra_links(canonical)
        )
        script = f'<script type="application/ld+json">{ld}</script>\n'
        return _Response(200, _document(f"{name} - The Shop", body, kind="product",
                                        head=script))

    @staticmethod
    def error(status: int, headers: tuple[tuple[str, str], ...] = ()) -> _Response:
        phrase = HTTPStatus(status).phrase
        body = f"<h1>{status} {_esc(phrase)}</h1>\n"
        return _Response(status, _document(f"{status} {phrase}", body, kind="error"),
                         headers=headers)

    # -- dispatch ---------------------------------------------------------------------

    @staticmethod
    def _number(text: str) -> int | None:
        """A positive decimal number without leading zeros, or None."""
        if 0 < len(text) <= 18 and text.isascii() and text.isdigit() and text[0] != "0":
            return int(text)
        return None

    def respond(self, target: str) -> _Response:
        canonical = canonical_path(target)
        with self.lock:
            self.hits[canonical] += 1
        path, _, query = canonical.partition("?")
        c = self.config
        if path == "/":
            return self.home()
        if path == "/robots.txt":
            return _Response(200, b"User-agent: *\nAllow: /\n", "text/plain; charset=utf-8")
        if path.startswith("/category/"):
            cat = self._number(path[len("/category/"):])
            page = self._number(query[len("page="):])
            if cat is None or page is None or cat > c.categories or page > c.category_pages(cat):
                return self.error(404)
            return self.listing(cat, page)
        if path.startswith("/product/"):
            p = self._number(path[len("/product/"):])
            if p is None or p > c.products:
                return self.error(404)
            return self.product_with_faults(p)
        return self.error(404)

    def product_with_faults(self, p: int) -> _Response:
        c = self.config
        with self.lock:
            self.product_requests[p] += 1
            n = self.product_requests[p]
        if c.slow_every and p % c.slow_every == 0:
            time.sleep(c.slow_delay)
        if p in self.always_fail:
            return self.error(500)
        flaky = n <= c.flaky_failures
        if flaky and c.error_every and p % c.error_every == 0:
            return self.error(500)
        if flaky and c.throttle_every and p % c.throttle_every == 0:
            return self.error(429, (("Retry-After", "1"),))
        return self.product(p)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "RedcrawlShop/1.0"
    sys_version = ""
    disable_nagle_algorithm = True
    timeout = 60  # idle keep-alive connections are closed after this many seconds
    server: _Server

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _serve(self, *, head: bool) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length, self.close_connection = 0, True
        if length > 0:  # a body on GET/HEAD: read and ignore it, to keep the connection usable
            self.rfile.read(length)
        response = self.server.shop.respond(self.path)
        lines = [
            f"{self.protocol_version} {response.status} {HTTPStatus(response.status).phrase}",
            f"Server: {self.server_version}",
            f"Date: {self.date_time_string()}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
        ]
        lines.extend(f"{name}: {value}" for name, value in response.headers)
        if self.close_connection:
            lines.append("Connection: close")
        elif self.request_version == "HTTP/1.0":
            lines.append("Connection: keep-alive")
        head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        # One write for head and body: no Nagle / delayed-ACK stall between the two.
        self.wfile.write(head_bytes if head else head_bytes + response.body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: tests and benchmarks make thousands of requests


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], shop: _Shop) -> None:
        self.shop = shop
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN (a DNS query): skip it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def process_request(self, request: socket.socket,  # type: ignore[override]
                        client_address: tuple[str, int]) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Shut down open keep-alive connections (their handler threads then exit)."""
        with self._connections_lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # the client went away or idled out
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Server6(_Server):
    address_family = socket.AF_INET6


class ShopSite:
    """The shop, served in a background daemon thread.

    ``start()`` binds and serves (``port=0``: a free port; see :attr:`url`), ``stop()``
    stops serving and closes open connections; or use it as a context manager. The
    request counters are thread-safe.
    """

    def __init__(self, config: SiteConfig = DEFAULT_CONFIG, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.config = config
        self.host = host
        self._port = port
        self._shop = _Shop(config)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> ShopSite:
        """Bind and serve in a background daemon thread; returns ``self``."""
        if self._server is not None:
            return self
        cls = _Server6 if ":" in self.host else _Server
        server = cls((self.host, self._port), self._shop)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"shop-site:{server.server_port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close open connections and free the port (idempotent)."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        server.shutdown()
        server.close_connections()
        server.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> ShopSite:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        """The port served on (only while running)."""
        if self._server is None:
            raise RuntimeError("ShopSite is not running: call start() first")
        return self._server.server_port

    @property
    def url(self) -> str:
        """The site's base URL, e.g. ``http://127.0.0.1:54321`` (only while running)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- counters and the site's shape --------------------------------------------------

    def hits(self) -> dict[str, int]:
        """Requests served per canonical path (see :func:`canonical_path`), including
        failed and 404 requests."""
        with self._shop.lock:
            return dict(self._shop.hits)

    def reset_hits(self) -> None:
        """Forget :meth:`hits` (the failure counters are kept: see :meth:`reset_failures`)."""
        with self._shop.lock:
            self._shop.hits.clear()

    def reset_failures(self) -> None:
        """Forget the per-product request counts, so flaky pages fail again."""
        with self._shop.lock:
            self._shop.product_requests.clear()

    def product_ids(self) -> list[int]:
        """All product ids, ``1 .. config.products``."""
        return list(range(1, self.config.products + 1))

    def canonical_pages(self) -> set[str]:
        """Every canonical path a complete crawl must fetch: ``/``, every listing page
        (``/category/3?page=2``) and every product page (``/product/17``)."""
        return self._shop.canonical_pages()

    def expected_sku(self, product: int) -> str:
        """The SKU shown on a product's page."""
        return self._shop.sku(product)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the shop until interrupted (Ctrl-C)."""
    parser = argparse.ArgumentParser(prog="python -m redcrawl.demo.site",
                                     description="Serve the redcrawl demo shop on loopback.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 = a free port")
    parser.add_argument("--demo", action="store_true",
                        help="the demo configuration (3000 products, slow/flaky/poison pages)")
    parser.add_argument("--products", type=int)
    parser.add_argument("--per-page", type=int)
    parser.add_argument("--categories", type=int)
    parser.add_argument("--links-per-page", type=int, help="bench mode: extra links per page")
    parser.add_argument("--slow-every", type=int)
    parser.add_argument("--slow-delay", type=float)
    parser.add_argument("--error-every", type=int)
    parser.add_argument("--throttle-every", type=int)
    parser.add_argument("--no-tracking", action="store_true", help="no tracking-parameter links")
    args = parser.parse_args(argv)
    config = SiteConfig.demo() if args.demo else SiteConfig()
    overrides = {name: getattr(args, name) for name in (
        "products", "per_page", "categories", "links_per_page", "slow_every", "slow_delay",
        "error_every", "throttle_every") if getattr(args, name) is not None}
    if args.no_tracking:
        overrides["tracking_params"] = False
    try:
        config = dataclasses.replace(config, **overrides)
    except ValueError as exc:
        parser.error(str(exc))
    site = ShopSite(config, host=args.host, port=args.port)
    try:  # before start(): a Ctrl-C right after the banner must still stop cleanly
        site.start()
        print(f"Serving the shop ({config.pages} pages) at {site.url}/ - Ctrl-C to stop",
              flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        site.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
