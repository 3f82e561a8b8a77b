# Over 450 lines on purpose: every demo page, each a pure function of its URL and the config.
"""The demo shop's pages: :class:`SiteConfig` and :class:`Shop`, which renders every page
as a pure function of its URL and the configuration, and its misbehaviour rules (slow,
failing, throttled and poison products). Served over HTTP by :mod:`redcrawl.demo.site`,
whose docstring describes the pages.
"""

from __future__ import annotations

import html
import json
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import NamedTuple
from urllib.parse import parse_qsl, urlsplit

__all__ = ["DEFAULT_CONFIG", "Shop", "SiteConfig", "canonical_path", "is_tracking_param"]


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
        for name in (
            "products",
            "slow_every",
            "error_every",
            "throttle_every",
            "flaky_failures",
            "links_per_page",
        ):
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
        return cls(
            products=3000,
            slow_every=97,
            error_every=53,
            throttle_every=71,
            always_fail=(1234,),
            tracking_params=True,
        )

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

_ADJECTIVES = (
    "Sturdy",
    "Elegant",
    "Compact",
    "Rustic",
    "Vintage",
    "Sleek",
    "Cozy",
    "Rugged",
    "Classic",
    "Modern",
    "Deluxe",
    "Handmade",
    "Portable",
    "Bright",
    "Quiet",
    "Smart",
)
_MATERIALS = (
    "Oak",
    "Steel",
    "Linen",
    "Ceramic",
    "Bamboo",
    "Copper",
    "Wool",
    "Glass",
    "Leather",
    "Marble",
    "Cotton",
)
_NOUNS = (
    "Lamp",
    "Chair",
    "Mug",
    "Backpack",
    "Kettle",
    "Blanket",
    "Clock",
    "Notebook",
    "Vase",
    "Speaker",
    "Jacket",
    "Bowl",
    "Shelf",
)
_CATEGORY_NAMES = (
    "Home & Kitchen",
    "Garden & Patio",
    "Books",
    "Café Supplies",
    "Outdoor",
    "Toys & Games",
    "Office",
    "Music",
    "Sports",
    "Crafts",
)
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


class Shop:
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
        return (
            '<section class="more"><h2>More from the shop</h2><ul>\n'
            + "\n".join(items)
            + "\n</ul></section>\n"
        )

    # -- pages ------------------------------------------------------------------------

    def home(self) -> _Response:
        c = self.config
        cats = []
        for cat in range(1, c.categories + 1):
            href = f"/category/{cat}?page=1"
            if cat % 2 == 0:
                href = self.track(href, "utm_source=home&utm_medium=nav")
            cats.append(
                f'<li><a class="category-link" href="{_esc(href)}">'
                f"{_esc(self.category_name(cat))}</a></li>"
            )
        featured = []
        for i, p in enumerate(self.spread("featured", _FEATURED)):
            href = self.track(
                f"/product/{p}", ("utm_source=home&utm_medium=featured", "ref=home")[i % 2]
            )
            featured.append(
                f'<li><a class="featured-link" href="{_esc(href)}">'
                f"{_esc(self.product_name(p))}</a></li>"
            )
        body = (
            '<header><h1><a href="/">The Shop</a></h1></header>\n'
            '<nav class="categories"><h2>Categories</h2><ul>\n'
            + "\n".join(cats)
            + "\n</ul></nav>\n"
            '<section class="featured"><h2>Featured</h2><ul>\n'
            + "\n".join(featured)
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
            href = self.track(
                f"/product/{p}", ("", "utm_source=listing&utm_medium=web", f"ref=cat{cat}")[j % 3]
            )
            more = ""
            if j % 4 == 0:
                more_href = self.track(
                    f"/product/{p}", "utm_source=listing&utm_medium=web&utm_content=more"
                )
                more = f' <a class="more-info" href="{_esc(more_href)}">More info</a>'
            cards.append(
                f'<li class="product-card" data-product-id="{p}">'
                f'<a class="thumb" href="/product/{p}"><span class="img">#{p}</span></a> '
                f'<a class="product-link" href="{_esc(href)}">{_esc(self.product_name(p))}</a>'
                f' <span class="price">{self.price(p)}</span>{more}</li>'
            )
        pager = []
        if page > 1:
            pager.append(
                f'<a rel="prev" class="prev" href="/category/{cat}?page={page - 1}">Previous</a>'
            )
        for n in range(1, last + 1):
            current = ' aria-current="page"' if n == page else ""
            pager.append(f'<a class="page"{current} href="/category/{cat}?page={n}">{n}</a>')
        if page < last:
            nxt = _esc(self.track(f"/category/{cat}?page={page + 1}", "ref=next"))
            pager.append(f'<a rel="next" class="next" href="{nxt}">Next</a>')
        body = (
            '<nav class="breadcrumb"><a href="/">Home</a> &rsaquo; '
            f'<span class="category-name">{_esc(name)}</span></nav>\n'
            f"<h1>{_esc(name)} <small>page {page} of {last}</small></h1>\n"
            '<ul class="products">\n' + "\n".join(cards) + "\n</ul>\n"
            '<nav class="pagination">' + " ".join(pager) + "</nav>\n" + self.extra_links(canonical)
        )
        return _Response(200, _document(f"{name} - page {page} - The Shop", body, kind="listing"))

    def product(self, p: int) -> _Response:
        c = self.config
        cat = c.category_of(p)
        canonical = f"/product/{p}"
        name, price, sku, cat_name = (
            self.product_name(p),
            self.price(p),
            self.sku(p),
            self.category_name(cat),
        )
        listing_href = self.track(f"/category/{cat}?page={c.listing_page_of(p)}", "ref=breadcrumb")
        ld = json.dumps(
            {
                "@context": "https://schema.org",
                "@type": "Product",
                "productID": p,
                "sku": sku,
                "name": name,
                "category": cat_name,
                "offers": {"@type": "Offer", "price": price, "priceCurrency": "EUR"},
            },
            ensure_ascii=False,
        ).replace("</", "<\\/")
        related = []
        for k, q in enumerate(self.spread(f"related:{p}", _RELATED, exclude=p)):
            href = self.track(
                f"/product/{q}", ("", "ref=related", f"utm_source=related&utm_campaign=p{p}")[k % 3]
            )
            related.append(
                f'<li><a class="related-product" href="{_esc(href)}">'
                f"{_esc(self.product_name(q))}</a></li>"
            )
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
            + "\n".join(related)
            + "\n</ul></section>\n"
            + self.extra_links(canonical)
        )
        script = f'<script type="application/ld+json">{ld}</script>\n'
        return _Response(200, _document(f"{name} - The Shop", body, kind="product", head=script))

    @staticmethod
    def error(status: int, headers: tuple[tuple[str, str], ...] = ()) -> _Response:
        phrase = HTTPStatus(status).phrase
        body = f"<h1>{status} {_esc(phrase)}</h1>\n"
        return _Response(
            status, _document(f"{status} {phrase}", body, kind="error"), headers=headers
        )

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
            cat = self._number(path[len("/category/") :])
            page = self._number(query[len("page=") :])
            if cat is None or page is None or cat > c.categories or page > c.category_pages(cat):
                return self.error(404)
            return self.listing(cat, page)
        if path.startswith("/product/"):
            p = self._number(path[len("/product/") :])
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
