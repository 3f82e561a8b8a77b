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

The pages themselves are made in :mod:`redcrawl.demo.shop`; this module serves them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from redcrawl.demo.shop import DEFAULT_CONFIG as DEFAULT_CONFIG
from redcrawl.demo.shop import Shop, SiteConfig
from redcrawl.demo.shop import canonical_path as canonical_path
from redcrawl.demo.shop import is_tracking_param as is_tracking_param

__all__ = [
    "DEFAULT_CONFIG",
    "ShopSite",
    "SiteConfig",
    "canonical_path",
    "is_tracking_param",
    "main",
]


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

    def __init__(self, address: tuple[str, int], shop: Shop) -> None:
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

    def process_request(
        self,
        request: socket.socket,  # type: ignore[override]
        client_address: tuple[str, int],
    ) -> None:
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

    def __init__(
        self, config: SiteConfig = DEFAULT_CONFIG, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.config = config
        self.host = host
        self._port = port
        self._shop = Shop(config)
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
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"shop-site:{server.server_port}",
            daemon=True,
        )
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
    parser = argparse.ArgumentParser(
        prog="python -m redcrawl.demo.site", description="Serve the redcrawl demo shop on loopback."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 = a free port")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="the demo configuration (3000 products, slow/flaky/poison pages)",
    )
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
    overrides = {
        name: getattr(args, name)
        for name in (
            "products",
            "per_page",
            "categories",
            "links_per_page",
            "slow_every",
            "slow_delay",
            "error_every",
            "throttle_every",
        )
        if getattr(args, name) is not None
    }
    if args.no_tracking:
        overrides["tracking_params"] = False
    try:
        config = dataclasses.replace(config, **overrides)
    except ValueError as exc:
        parser.error(str(exc))
    site = ShopSite(config, host=args.host, port=args.port)
    try:  # before start(): a Ctrl-C right after the banner must still stop cleanly
        site.start()
        print(
            f"Serving the shop ({config.pages} pages) at {site.url}/ - Ctrl-C to stop", flush=True
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        site.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
