"""Commands that observe crawls through Redis: ``exporter`` (Prometheus metrics without
the API), ``watch`` (the alerting watchdog) and ``top`` (a live terminal view). The work
is in :mod:`redcrawl.metrics`; docs/metrics.md describes the metrics and rules."""

from __future__ import annotations

import contextlib
import logging
import time
import urllib.parse
from enum import StrEnum
from typing import Annotated

import redis
import typer
from rich.console import Console

from redcrawl.cli._common import (
    EXIT_USAGE,
    CrawlName,
    RedisUrl,
    _alive,
    _connect,
    _crawl,
    _crawls,
    _existing,
    _fail,
    _guard,
    _settings,
    _where,
    app,
    console,
)
from redcrawl.connection import connect_bounded
from redcrawl.metrics.snapshot import MAX_CRAWLS, SnapshotReader
from redcrawl.settings import Settings
from redcrawl.urls import loopback_host


class HostsSort(StrEnum):
    ready = "ready"
    inflight = "inflight"


MaxCrawls = Annotated[
    int,
    typer.Option(
        "--max-crawls",
        min=1,
        help="Most crawls read per scrape or poll (from the crawl registry, docs/metrics.md).",
    ),
]
Crawls = Annotated[
    list[str] | None,
    typer.Option(
        "--crawl",
        envvar="REDCRAWL_CRAWL",
        help="A crawl to read (repeat for more). "
        "Default: every crawl in the Redis, up to --max-crawls.",
    ),
]


EXPORTER_RETRIES = 1
"""Retries of a Redis command in a scrape (after the first attempt)."""
EXPORTER_SOCKET_TIMEOUT = 2.0
"""Seconds a scrape waits for Redis's reply to a command (a hung server: SIGSTOP, a
full machine) before the attempt fails."""
EXPORTER_CONNECT_TIMEOUT = 1.0
"""Seconds a scrape waits for a connection (a host that drops packets)."""


def exporter_client(settings: Settings) -> redis.Redis:
    """The exporter's Redis client: a scrape fails fast on an outage (``redcrawl_up 0``)
    instead of retrying as a worker does for ~30 s, inside Prometheus's default 10 s
    ``scrape_timeout`` even when the server is hung: (1 + EXPORTER_RETRIES) attempts of at
    most EXPORTER_CONNECT_TIMEOUT + EXPORTER_SOCKET_TIMEOUT each, plus the backoff between
    them (about 6 s at worst; about 4 s with a hung server, well under 1 s refused)."""
    return connect_bounded(
        settings,
        socket_timeout=EXPORTER_SOCKET_TIMEOUT,
        connect_timeout=EXPORTER_CONNECT_TIMEOUT,
        retries=EXPORTER_RETRIES,
    )


@app.command()
@_guard
def exporter(
    redis_url: RedisUrl = None,
    crawl: Crawls = None,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port of the /metrics endpoint (0: any free one).")
    ] = 9808,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    max_crawls: MaxCrawls = MAX_CRAWLS,
) -> None:
    """Serve Prometheus metrics of the crawls on http://HOST:PORT/metrics, read from Redis
    at each scrape (for setups without `redcrawl serve`, which serves the same at
    /metrics). No authentication: bind it where only Prometheus reaches it."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server

        from redcrawl.metrics.collector import RedisCollector
    except ImportError:
        raise _fail(
            "the exporter needs prometheus-client: pip install 'redcrawl[api]'", EXIT_USAGE
        ) from None
    settings = _settings(redis_url)
    checked = _connect(settings)
    _warn_missing(settings, checked, crawl or [])
    checked.close()
    client = exporter_client(settings)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        RedisCollector(SnapshotReader(client, settings, crawls=crawl or (), max_crawls=max_crawls))
    )
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:  # the port is in use, the address is not this machine's, ...
        raise _fail(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; give another --port "
            "(or --host), or stop what listens there",
            EXIT_USAGE,
        ) from None
    console.print(f"serving metrics on http://{host}:{server.server_port}/metrics", highlight=False)
    if not loopback_host(host):
        typer.echo(
            f"warning: {host} is not a loopback address: /metrics has no authentication, so "
            "anyone who reaches this port reads every crawl's names, counts and workers, and "
            "the Redis server's state; make sure only Prometheus can reach it",
            err=True,
        )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()


@app.command()
@_guard
def watch(
    webhook: Annotated[
        str, typer.Option(help="URL to POST alerts to (JSON with a Slack-compatible `text` field).")
    ],
    redis_url: RedisUrl = None,
    crawl: Crawls = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between polls.")] = 15.0,
    polls: Annotated[
        int | None,
        typer.Option(help="Stop after this many polls (default: run until interrupted)."),
    ] = None,
    max_crawls: MaxCrawls = MAX_CRAWLS,
) -> None:
    """Watch the crawls and POST an alert to WEBHOOK when a rule starts or stops firing
    (the rules of deploy/prometheus/alerts.yml, evaluated on Redis directly: no Prometheus
    needed). A webhook that is down is retried at each poll; the watch runs until Ctrl-C
    or SIGTERM (or --polls)."""
    from redcrawl.metrics.watch import Watchdog, webhook_site

    if problem := _webhook_problem(webhook):
        raise _fail(f"--webhook {webhook!r}: {problem}", EXIT_USAGE)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    settings = _settings(redis_url)
    client = _connect(settings)
    _warn_missing(settings, client, crawl or [])
    reader = SnapshotReader(client, settings, crawls=crawl or (), max_crawls=max_crawls)
    dog = Watchdog(
        reader,
        webhook,
        echo=lambda n: console.print(n.payload()["text"], highlight=False, soft_wrap=True),
    )
    which = ", ".join(crawl) if crawl else f"every crawl (up to {max_crawls})"
    console.print(
        f"watching {which} in {_where(settings)} every "
        f"{interval:g} s; alerts go to {webhook_site(webhook)}",
        highlight=False,
        soft_wrap=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        dog.run(interval, polls=polls)


def _warn_missing(settings: Settings, client: redis.Redis, names: list[str]) -> None:
    """Say each crawl of ``names`` that does not exist (yet): a typo in ``--crawl`` would
    otherwise be watched or exported as zeros without a word. Not an error: a crawl may be
    created after the exporter or the watchdog starts."""
    missing = [
        n for n, ok in zip(names, _alive(client, settings.key_prefix, names), strict=True) if not ok
    ]
    if not missing:
        return
    crawls = _crawls(client, settings.key_prefix)
    listed = f"crawls there: {', '.join(crawls)}" if crawls else "it holds no crawl"
    for name in missing:
        console.print(
            f"[yellow]warning:[/] no crawl named {name!r} in {_where(settings)} (yet); it reads "
            f"as empty (0) until a request is pushed to it; {listed}",
            highlight=False,
            soft_wrap=True,
        )


def _webhook_problem(url: str) -> str | None:
    """Why ``url`` cannot take the watchdog's POSTs, or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not 0-65535)
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "give an http:// or https:// URL (e.g. a Slack incoming webhook)"
    if not parts.hostname:
        return "the URL names no host"
    return None


@app.command()
@_guard
def top(
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between frames.")] = 1.0,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame and exit (e.g. to a file or pipe).")
    ] = False,
    hosts: Annotated[
        int,
        typer.Option(
            min=0,
            max=100,
            help="Politeness keys in the hosts panel (crawls with politeness; 0: no panel).",
        ),
    ] = 10,
    hosts_sort: Annotated[
        HostsSort, typer.Option("--hosts-sort", help="Order of the hosts panel.")
    ] = HostsSort.ready,
) -> None:
    """A live view of one crawl: its states and rates, its workers with their heartbeat
    age, for a crawl with politeness its top hosts (ready, in flight, delay, concurrency,
    block, and why each is not served now), its most recent dead letters. Ctrl-C quits."""
    from redcrawl.metrics.top import Top

    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    _existing(settings, client, name)
    view = Top(
        SnapshotReader(client, settings, crawls=[name]),
        name,
        hosts=hosts,
        hosts_sort="inflight" if hosts_sort is HostsSort.inflight else "ready",
    )
    out = Console()
    if once:
        view.once(out)
        return
    with contextlib.suppress(KeyboardInterrupt):
        view.run(out, interval)
