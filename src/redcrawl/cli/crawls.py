"""Commands that look at or steer one crawl: ``status``, ``crawls``, ``seed``, ``dead``,
``pause``, ``resume``, ``purge``."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from redcrawl.callbacks import callback_name_problem
from redcrawl.cli._common import (
    EXIT_FAILED,
    EXIT_USAGE,
    CrawlName,
    RedisUrl,
    _connect,
    _crawl,
    _crawls,
    _existing,
    _fail,
    _guard,
    _lost_anchor,
    _print_counts,
    _settings,
    _state,
    _state_exists,
    _where,
    app,
)
from redcrawl.connection import EmbeddedRedis, redact, redis_cli_hint
from redcrawl.errors import partitions_lost_text
from redcrawl.frontier import open_frontier
from redcrawl.frontier.partitioned import partitions_left
from redcrawl.guard import memory_warning
from redcrawl.keys import CrawlKeys
from redcrawl.metrics.registry import leftovers
from redcrawl.politeness.describe import PolitenessSummary, politeness_summary
from redcrawl.transport import redis_errors
from redcrawl.urls import url_problem

# --- inspection and operator actions ------------------------------------------------------

Yes = Annotated[bool, typer.Option("--yes", "-y", help="Don't ask.")]


@app.command()
@_guard
def status(
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False,
) -> None:
    """Show a crawl's counts (ready, delayed, in flight, done, dead), its state, its
    politeness counters (deferrals, keys blocked now, politeness wait), its workers, and
    where its Redis listens."""
    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    _existing(settings, client, name)
    frontier = open_frontier(client, settings, name, follow_layout=True)
    c = frontier.counts()
    stats = frontier.stats()
    lost = frontier.lost_partitions()
    state = _state(frontier, c, lost)
    now = frontier.server_time()
    workers = {w: until - now for w, until in frontier.workers().items()}
    sock = None if settings.redis_url else EmbeddedRedis(settings.embedded_dir).socket
    polite = politeness_summary(frontier)
    memory = memory_warning(client, settings)
    if as_json:
        out = {
            **{f: getattr(c, f) for f in c.__dataclass_fields__},
            "finished": c.finished and not lost,  # (a damaged crawl is never finished)
            "filtered_local": stats.get("filtered_local", 0),
            "items": stats.get("items", 0),
            "robots_disallowed": stats.get("robots_disallowed", 0),
            "orphaned": stats.get("orphaned", 0),
            "state": state,
            "lost_partitions": lost,
            "paused": frontier.is_paused(),
            "workers": {w: {"alive": left > 0} for w, left in workers.items()},
            "politeness": dataclasses.asdict(polite) if polite else None,
            "memory_warning": memory,
            "redis": {
                "url": redact(settings.redis_url) if settings.redis_url else None,
                "socket": str(sock) if sock else None,
            },
        }
        typer.echo(json.dumps(out))
        return
    _print_counts(c, name, stats, state)
    if lost:
        typer.echo(f"error: {partitions_lost_text(name, lost, frontier.settings.partitions)}")
    if polite is not None:
        typer.echo(_politeness_line(polite))
    for w, left in sorted(workers.items()):
        typer.echo(
            f"worker {w}: " + (f"alive ({left:.0f}s of heartbeat left)" if left > 0 else "gone")
        )
    if memory is not None:
        typer.echo(f"warning: {memory}")
    if sock is not None:
        typer.echo(f"embedded Redis: unix socket {sock} (redis-cli -s {sock})")
    else:
        typer.echo(f"Redis: {_where(settings)} (look inside: {redis_cli_hint(settings)})")


def _politeness_line(p: PolitenessSummary) -> str:
    deferred = ", ".join(f"{n:,} on {reason}" for reason, n in p.deferred.items())
    return (
        f"politeness (fleet-wide, one key per {p.key}): politeness wait "
        f"{p.wait_s:,.1f} s; deferred {p.deferred_total:,}"
        + (f" ({deferred})" if deferred else "")
        + f"; keys blocked now: {p.blocked:,} (`redcrawl hosts` for each site)"
    )


@app.command("crawls")
@_guard
def list_crawls(
    redis_url: RedisUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False,
) -> None:
    """List the crawls in the Redis with their counts and state."""
    settings = _settings(redis_url)
    client = _connect(settings)
    rows = []
    for name in _crawls(client, settings.key_prefix):
        frontier = open_frontier(client, settings, name, follow_layout=True)
        c = frontier.counts()
        rows.append((name, c, _state(frontier, c)))
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "crawl": n,
                        "accepted": c.accepted,
                        "done": c.done,
                        "pending": c.pending,
                        "dead": c.dead,
                        "state": s,
                    }
                    for n, c, s in rows
                ]
            )
        )
        return
    if not rows:
        typer.echo(f"no crawls in {_where(settings)}")
        return
    table = Table("crawl", "accepted", "done", "pending", "dead", "state")
    for n, c, s in rows:
        table.add_row(n, f"{c.accepted:,}", f"{c.done:,}", f"{c.pending:,}", f"{c.dead:,}", s)
    Console().print(table)


def _seed_lines(file: Path) -> list[str]:
    """The URLs of a seed file (``-``: stdin): one per line, UTF-8, blank lines and
    ``#`` comment lines skipped. A file that can't be read is a usage error (exit 2)."""
    where = "stdin" if str(file) == "-" else str(file)
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(
            f"--file {where}: not UTF-8 text (byte {exc.start}: {exc.reason}); give a "
            "text file with one URL a line",
            EXIT_USAGE,
        ) from None
    except IsADirectoryError:
        raise _fail(
            f"--file {where} is a folder; give a file with one URL a line", EXIT_USAGE
        ) from None
    except FileNotFoundError:
        raise _fail(f"--file {where}: no such file", EXIT_USAGE) from None
    except OSError as exc:
        raise _fail(f"--file {where}: {exc.strerror or exc}", EXIT_USAGE) from None
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@app.command()
@_guard
def seed(
    urls: Annotated[list[str] | None, typer.Argument(help="URLs to crawl.")] = None,
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            help="Read URLs from a UTF-8 file, one per line ('-': stdin); blank lines and "
            "lines starting with # are skipped.",
        ),
    ] = None,
    callback: Annotated[
        str | None, typer.Option(help="Spider method to parse them with (default: parse).")
    ] = None,
    priority: Annotated[int, typer.Option(help="Request priority.")] = 0,
    recrawl: Annotated[
        bool,
        typer.Option(
            "--recrawl", help="Crawl URLs again even if they are done (not if still queued)."
        ),
    ] = False,
) -> None:
    """Put start URLs straight into a crawl's frontier (durable, deduplicated). Starts
    the embedded Redis if need be: seeding before the first crawl is fine."""
    from redcrawl.scrapy.scheduler import seed as push_seeds

    items = list(urls or [])
    if file is not None:
        items += _seed_lines(file)
    for url in items:
        if problem := url_problem(url):
            raise _fail(f"{url!r}: {problem}; nothing was seeded", EXIT_USAGE)
    if callback is not None and (problem := callback_name_problem(callback)):
        raise _fail(f"--callback {problem}; nothing was seeded", EXIT_USAGE)
    if not items:
        raise _fail("give URLs as arguments or with --file", EXIT_USAGE)
    settings = _settings(redis_url)
    name = _crawl(settings, crawl_name, _connect(settings) if _state_exists(settings) else None)
    client = _connect(settings, create=True)
    result = push_seeds(
        items,
        settings=settings,
        crawl=name,
        callback=callback,
        priority=priority,
        recrawl=recrawl,
        client=client,
    )
    typer.echo(f"seeded {result.accepted} URL(s); {result.filtered} already known")


def _time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@app.command()
@_guard
def dead(
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    limit: Annotated[int, typer.Option(min=1, help="How many to list.")] = 50,
    requeue: Annotated[
        bool, typer.Option("--requeue", help="Send the listed dead requests back to the queue.")
    ] = False,
) -> None:
    """List dead-lettered requests (oldest first: when each died, in UTC, its URL,
    attempts and last error); --requeue sends them back."""
    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    _existing(settings, client, name)
    frontier = open_frontier(client, settings, name, follow_layout=True)
    rows = frontier.dead(limit)
    for d in rows:
        typer.echo(f"{_time(d.died_at)}  {d.id}  {d.url}  attempts={d.attempts}  {d.error}")
    if not rows:
        typer.echo("no dead requests")
    if requeue and rows:
        n = frontier.requeue_dead([d.id for d in rows])
        typer.echo(f"requeued {n}")


def _switch(redis_url: str | None, crawl_name: str | None, pause: bool) -> None:
    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    _existing(settings, client, name)
    frontier = open_frontier(client, settings, name, follow_layout=True)
    if pause:
        frontier.pause()
        typer.echo(
            f"paused crawl {name}: workers lease nothing new (what they hold is "
            f"finished) until `redcrawl resume --crawl {name}`"
        )
    else:
        frontier.resume()
        typer.echo(f"resumed crawl {name}")


@app.command()
@_guard
def pause(redis_url: RedisUrl = None, crawl_name: CrawlName = None) -> None:
    """Pause a crawl: its workers lease nothing new until `redcrawl resume`."""
    _switch(redis_url, crawl_name, pause=True)


@app.command()
@_guard
def resume(redis_url: RedisUrl = None, crawl_name: CrawlName = None) -> None:
    """Resume a paused crawl."""
    _switch(redis_url, crawl_name, pause=False)


@app.command("accept-loss")
@_guard
def accept_loss(
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    yes: Yes = False,
) -> None:
    """Go on with a partitioned crawl whose partitions lost their state (`status` says
    "damaged"): what they held is given up, the rest is crawled on. Seed the crawl again
    to fetch their sites anew."""
    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    _existing(settings, client, name)
    frontier = open_frontier(client, settings, name, follow_layout=True)
    lost = frontier.lost_partitions()
    if not lost:
        typer.echo(f"crawl {name} lost no partition: nothing to accept")
        return
    which = ", ".join(map(str, lost))
    if not yes and not typer.confirm(
        f"Go on with crawl {name!r} without what partition(s) {which} held?"
    ):
        raise _fail(f"not accepted: crawl {name} is left as it was", EXIT_FAILED)
    frontier.accept_loss()
    typer.echo(
        f"crawl {name} goes on without what partition(s) {which} held. A running worker "
        "that worked there since they were lost stops with crawl_vanished when the crawl "
        "ends: start it again. Seed the crawl again to fetch their sites anew"
    )


@app.command()
@_guard
def purge(
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    yes: Yes = False,
) -> None:
    """Delete a crawl's whole state: queue, leases, dead letters, fingerprints."""
    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    # a typo is not "purged" (the API's DELETE: 404); but any state left of the crawl
    # (its stats gone, only a worker registered) is purged
    with redis_errors("reading what is stored of the crawl"):
        left = leftovers(client, settings.key_prefix, name)
    keys = CrawlKeys(name, prefix=settings.key_prefix)
    with redis_errors("reading the crawl layout"):
        anchored = client.hexists(keys.control, "layout")
    orphans = [] if anchored else partitions_left(client, keys)
    if orphans and settings.partitions == 1:  # a lost anchor: purged with its P only
        raise _lost_anchor(name, orphans)
    if not left and not orphans:
        _existing(settings, client, name)
    frontier = open_frontier(client, settings, name, follow_layout=True)
    if not yes and not typer.confirm(f"Delete everything of crawl {name!r}?"):
        raise _fail(f"not purged: crawl {name} is left as it was", EXIT_FAILED)
    frontier.purge()
    typer.echo(f"purged crawl {name}")
