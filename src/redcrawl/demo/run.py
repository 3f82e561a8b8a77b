"""``redcrawl demo``: serve the shop site, crawl it with N workers, report.

Everything is local: the site listens on 127.0.0.1, Redis is the embedded server (data in
``<dir>/redis``), items go to ``<dir>/items.db`` (SQLite, one row per product, written
idempotently by :class:`redcrawl.scrapy.pipelines.UpsertPipeline`).

A demo starts over (its crawl purged, ``items.db`` deleted), so it holds ``<dir>/demo.lock``
(``flock``) while it runs: a second demo in the same folder is refused
(:class:`DemoRunning`) instead of wiping the first one's crawl under its workers. The
kernel drops the lock when the process ends, however it ends: a finished or killed demo
never blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from redcrawl.connection import connect, resolve_url
from redcrawl.demo.dashboard import serving_dashboard
from redcrawl.demo.site import ShopSite, SiteConfig
from redcrawl.errors import RedcrawlError
from redcrawl.frontier import open_frontier
from redcrawl.progress import ProgressDisplay
from redcrawl.settings import Settings
from redcrawl.workers import WorkerEvent, run_workers

__all__ = ["DemoRunning", "demo_lock", "run_demo"]

CRAWL = "demo"
SPIDER = Path(__file__).with_name("spider.py")


class DemoRunning(RedcrawlError):
    """Another demo runs in the folder (``redcrawl demo`` exits 2)."""


@contextlib.contextmanager
def demo_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory/demo.lock`` (with this process's pid in it) while the demo runs;
    :class:`DemoRunning` if another process holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "demo.lock").open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip() or "?"
            raise DemoRunning(
                f"another redcrawl demo (pid {pid}) is running in {directory.resolve()}: "
                "starting one here would wipe its crawl; wait for it to finish, stop it "
                "(Ctrl-C), or give this one another --dir"
            ) from None
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def demo_worker_settings(items_db: Path) -> list[str]:
    """Scrapy settings of the demo's workers (as ``NAME=VALUE``)."""
    return [
        'ITEM_PIPELINES={"redcrawl.scrapy.pipelines.UpsertPipeline": 300}',
        f"REDCRAWL_ITEMS_URI=sqlite:///{items_db.resolve()}",
        "REDCRAWL_ITEM_KEY=sku",
        "REDCRAWL_CANONICALIZE=true",
        "REDCRAWL_CANONICAL_DROP_PARAMS=utm_*,ref",
        "REDCRAWL_MAX_ATTEMPTS=3",
        "REDCRAWL_RETRY_BACKOFF=0.5",
        "REDCRAWL_IDLE_BEFORE_CLOSE=1",
        "REDCRAWL_LEASE_TTL=30",
        "RETRY_TIMES=2",
        "CONCURRENT_REQUESTS=16",
        # the shop is one local site, and per-site limits hold for the whole fleet: up to
        # 64 of its requests leased at once across all workers (four workers of 16; a
        # request holds its slot from lease to ack, parsing included, so Scrapy's default
        # of 8 would hold the four workers to a third of their speed)
        "CONCURRENT_REQUESTS_PER_DOMAIN=64",
        "DOWNLOAD_TIMEOUT=10",
        "LOG_LEVEL=WARNING",
        "TELNETCONSOLE_ENABLED=False",
    ]


def run_demo(
    *,
    workers: int = 4,
    products: int = 3000,
    directory: Path = Path(".redcrawl-demo"),
    progress: bool = True,
) -> int:
    with demo_lock(directory):
        return _run_demo(workers, products, directory, progress)


def _run_demo(workers: int, products: int, directory: Path, progress: bool) -> int:
    console = Console()
    items_db = directory / "items.db"
    items_db.unlink(missing_ok=True)
    config = SiteConfig.demo()
    if products != config.products:
        from dataclasses import replace

        config = replace(
            config,
            products=products,
            always_fail=tuple(p for p in config.always_fail if p < products),
        )
    # the user's REDCRAWL_* variables reach the workers (they inherit the environment):
    # they apply here too, so that this process reads the crawl the workers make; the
    # demo's Redis stays its own embedded one
    embedded = directory / "redis"
    settings = Settings.from_env(base=Settings(embedded_dir=embedded)).replace(
        redis_url=None, embedded_dir=embedded
    )
    url = resolve_url(settings)
    frontier = open_frontier(connect(settings, url=url), settings, CRAWL)
    frontier.purge()
    started = time.monotonic()
    logs = directory / "logs"
    with ShopSite(config) as site, serving_dashboard(settings, frontier.client) as board:
        console.print(
            f"demo shop: {site.url} ({config.pages:,} pages, {config.products:,} "
            f"products); {workers} worker{'' if workers == 1 else 's'}; embedded Redis at "
            f"{url}; worker logs "
            f"in {logs}/"
        )
        console.print(f"dashboard: {board}")
        display = ProgressDisplay(Console(stderr=True)) if progress else None

        def report(event: WorkerEvent) -> None:
            (display.print if display else console.print)(event.message)
            if event.problems:
                console.print(event.problems, markup=False, highlight=False)
            elif event.log_tail and event.kind == "failed":
                console.print(event.log_tail, markup=False, highlight=False)

        with display if display is not None else contextlib.nullcontext():
            result = run_workers(
                str(SPIDER),
                workers=workers,
                settings=settings,
                crawl=CRAWL,
                settings_args=demo_worker_settings(items_db),
                spider_args=[f"url={site.url}"],
                log_dir=logs,
                progress=display,
                on_event=report,
            )
        code = result.code
        hits = site.hits()
        expected = site.canonical_pages()
    elapsed = time.monotonic() - started
    c = frontier.counts()
    stats = frontier.stats()
    from redcrawl.scrapy.pipelines import read_items

    items = read_items(f"sqlite:///{items_db.resolve()}") if items_db.exists() else {}
    missing = expected - set(hits)
    table = Table(title="redcrawl demo", show_header=False)
    rows = [
        ("pages fetched (distinct)", f"{len(set(hits) & expected):,} of {len(expected):,}"),
        ("HTTP requests made", f"{sum(hits.values()):,}"),
        ("requests done", f"{c.done:,}"),
        ("items scraped", f"{stats.get('items', 0):,}"),
        ("rows in SQLite", f"{len(items):,} ({items_db})"),
        ("duplicates filtered", f"{c.filtered + stats.get('filtered_local', 0):,}"),
        ("retries (redcrawl)", f"{c.retried:,}"),
        ("dead letters", f"{c.dead:,}"),
        ("finished", "yes" if c.finished else "no"),
        ("conservation", "holds" if c.conserved else "VIOLATED"),
        ("time", f"{elapsed:.1f} s"),
    ]
    for label, value in rows:
        table.add_row(label, value)
    console.print()
    console.print(table)
    for d in frontier.dead(10):
        console.print(f"  dead: {d.url} after {d.attempts} attempts: {d.error}")
    if missing:
        console.print(f"[red]{len(missing)} page(s) never fetched[/], e.g. {sorted(missing)[:5]}")
    ok = code == 0 and c.finished and c.conserved
    return code if code else (0 if ok else 1)
