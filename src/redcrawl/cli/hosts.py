"""``redcrawl hosts``: see and steer fleet-wide politeness per key (host), live. A thin layer
over :class:`redcrawl.politeness.hosts.Hosts` (the HTTP API calls the same)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

from redcrawl.cli._common import (
    EXIT_USAGE,
    CrawlName,
    RedisUrl,
    _connect,
    _crawl,
    _existing,
    _fail,
    _guard,
    _settings,
    app,
)
from redcrawl.frontier import open_frontier
from redcrawl.politeness.hosts import UNSET, BadHostInput, HostDetail, HostPage, Hosts, Sort
from redcrawl.politeness.hosts_records import (
    MAX_BLOCK,
    check_concurrency,
    check_delay,
    check_key,
)

hosts_app = typer.Typer(
    help="See and steer fleet-wide politeness per key (host), live: list the keys with "
    "work, show one (with why it is not served now), override its delay, concurrency, "
    "block or pause. `redcrawl hosts` alone lists.",
    no_args_is_help=False,
    rich_markup_mode="markdown",
)
app.add_typer(hosts_app, name="hosts")

AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable.")]
KeyArg = Annotated[str, typer.Argument(help="The politeness key, as `redcrawl hosts` lists it.")]

FLAGS = {
    "delay": "--delay",
    "concurrency": "--concurrency",
    "block_for": "--for",
    "block_until": "--until",
    "key": "KEY",
    "limit": "--top",
    "sort": "--sort",
    "paused": "--pause/--resume",
}
"""The flag (or argument) of each field :class:`BadHostInput` can name."""


def _bad_input(fn: Any) -> Any:
    """A value the library refuses: exit 2, naming the flag."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BadHostInput as exc:
            raise _fail(f"{FLAGS.get(exc.field, exc.field)}: {exc.problem}", EXIT_USAGE) from None

    return wrapper


def _hosts(
    ctx: typer.Context, redis_url: str | None, crawl_name: str | None, key: str | None = None
) -> Hosts:
    """The crawl's :class:`Hosts`; ``key`` (a command's KEY) checked before Redis is asked."""
    if key is not None:
        check_key(key)
    given = ctx.obj
    if isinstance(given, dict):  # flags given to `redcrawl hosts` before the subcommand
        redis_url = redis_url or given.get("redis_url")
        crawl_name = crawl_name or given.get("crawl_name")
    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    _existing(settings, client, name)
    return Hosts(open_frontier(client, settings, name, follow_layout=True))


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def duration(text: str) -> float:
    """``10m``, ``90s``, ``1.5h``, ``2d``, ``500ms`` or plain seconds, as seconds: a block's
    length, 1 ms to 30 days (told in the units given when it is not)."""
    m = _DURATION.match(text)
    if not m:
        raise BadHostInput("block_for", f"{text!r}: give a duration like 90s, 10m, 2h or 1d")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not 0.001 <= seconds <= MAX_BLOCK:
        what = "more than 30d" if seconds > MAX_BLOCK else "less than 1ms"
        raise BadHostInput("block_for", f"{text.strip()!r} is {what}: give 1ms to 30d")
    return seconds


def _when(at: float | None, now: float) -> str:
    if at is None or at <= now:
        return "now"
    left = at - now
    clock = datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")
    return f"in {left:.1f} s" if left < 120 else f"{clock} UTC (in {left / 60:.0f} min)"


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value)


def _print_page(page: HostPage) -> None:
    table = Table(
        title=f"crawl {page.crawl}: politeness keys by {page.sort}",
        caption=f"{page.scanned} keys read"
        + (
            ""
            if page.complete
            else " (a bounded sample: the keys that open first and those in flight)"
        )
        + (f"; next page: --cursor {page.next_cursor}" if page.next_cursor else ""),
    )
    for col in ("key", "ready", "in flight", "next allowed", "blocked", "paused"):
        table.add_column(col, justify="left" if col == "key" else "right")
    now = page.server_time
    for h in page.hosts:
        table.add_row(
            h.key,
            f"{h.ready:,}",
            f"{h.in_flight:,}",
            _when(h.next_allowed, now),
            _when(h.blocked_until, now) if h.blocked_until else "",
            "yes" if h.paused else "",
        )
    Console().print(table)


def _print_detail(d: HostDetail) -> None:
    now = d.server_time
    table = Table(title=f"crawl {d.crawl}: {d.key}", show_header=False)
    rows = [
        ("ready", f"{d.ready:,} (per tier: {', '.join(map(str, d.ready_per_tier))})"),
        ("in flight", f"{d.in_flight:,}"),
        ("concurrency", f"{d.concurrency.value:g} ({d.concurrency.source})"),
        (
            "delay",
            f"{d.delay.value:g} s ({d.delay.source})"
            + (", randomized" if d.randomize_delay else ""),
        ),
        ("next allowed", _when(d.next_allowed, now)),
    ]
    if d.block_until:
        rows.append(("blocked by operator", _when(d.block_until, now)))
    if d.block:
        rows.append(("blocked after 429/503", _when(d.block, now)))
    if d.paused:
        rows.append(("paused", "yes, by operator"))
    if d.crawl_delay is not None:
        rows.append(("robots.txt Crawl-delay", f"{d.crawl_delay:g} s"))
    if d.auto_delay is not None:
        rows.append(("AutoThrottle delay", f"{d.auto_delay:g} s"))
    for r in d.robots:
        rows.append((f"robots.txt {r.origin}", f"{r.kind} (HTTP {r.status})"))
    rows.append(("override", json.dumps(d.override) if d.override else "none"))
    rows.append(
        ("served now?", "yes: the next lease takes it" if d.why is None else f"no: {d.why}")
    )
    for label, value in rows:
        table.add_row(label, value)
    Console().print(table)
    for note in d.notes:
        typer.echo(f"note: {note}")


def _show(d: HostDetail, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(_plain(d)))
    else:
        _print_detail(d)


@hosts_app.callback(invoke_without_command=True)
@_guard
@_bad_input
def hosts(
    ctx: typer.Context,
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    top: Annotated[int, typer.Option("--top", help="Most keys shown (1-1000).")] = 20,
    sort: Annotated[
        str, typer.Option("--sort", help="ready (most ready first) or inflight.")
    ] = "ready",
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Show the page from this cursor on.")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """List the politeness keys with ready work or in flight, most ready first (bounded
    per call: the caption says when the list is a sample)."""
    if ctx.invoked_subcommand is not None:
        # `redcrawl hosts --crawl C show KEY`: the subcommand's own flags win
        ctx.obj = {"redis_url": redis_url, "crawl_name": crawl_name}
        return
    if sort not in ("ready", "inflight"):
        raise BadHostInput("sort", f"{sort!r}: give ready or inflight")
    page = _hosts(ctx, redis_url, crawl_name).top(limit=top, sort=cast(Sort, sort), cursor=cursor)
    if as_json:
        typer.echo(json.dumps(_plain(page)))
    else:
        _print_page(page)


@hosts_app.command("show")
@_guard
@_bad_input
def show(
    ctx: typer.Context,
    key: KeyArg,
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    as_json: AsJson = False,
) -> None:
    """One key: ready, in flight, its limits and where they come from, blocks, robots.txt,
    and why it is not served right now."""
    _show(_hosts(ctx, redis_url, crawl_name, key).show(key), as_json)


@hosts_app.command("set")
@_guard
@_bad_input
def set_(
    ctx: typer.Context,
    key: KeyArg,
    delay: Annotated[
        float | None, typer.Option("--delay", help="Seconds between fetch starts (0-86400).")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", help="Most in flight (1-10000).")
    ] = None,
    paused: Annotated[
        bool | None, typer.Option("--pause/--resume", help="Serve nothing of the key / again.")
    ] = None,
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    as_json: AsJson = False,
) -> None:
    """Override a key's delay, concurrency or pause (the other fields stay); the next
    lease obeys it."""
    if delay is None and concurrency is None and paused is None:
        raise _fail("give --delay, --concurrency, --pause or --resume", EXIT_USAGE)
    # (bad values refused before Redis is asked: the same checks Hosts.set makes)
    if delay is not None:
        check_delay(delay)
    if concurrency is not None:
        check_concurrency(concurrency)
    h = _hosts(ctx, redis_url, crawl_name, key)
    d = h.set(
        key,
        delay=UNSET if delay is None else delay,
        concurrency=UNSET if concurrency is None else concurrency,
        paused=UNSET if paused is None else paused,
    )
    _show(d, as_json)


@hosts_app.command("block")
@_guard
@_bad_input
def block(
    ctx: typer.Context,
    key: KeyArg,
    for_: Annotated[str, typer.Option("--for", help="How long: 90s, 10m, 2h, 1d (at most 30d).")],
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    as_json: AsJson = False,
) -> None:
    """Serve nothing of a key for a while (every worker), from now on the server's clock."""
    seconds = duration(for_)
    _show(_hosts(ctx, redis_url, crawl_name, key).set(key, block_for=seconds), as_json)


@hosts_app.command("unblock")
@_guard
@_bad_input
def unblock(
    ctx: typer.Context,
    key: KeyArg,
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    as_json: AsJson = False,
) -> None:
    """Lift the operator's block of a key (a block after 429/503 responses runs its course)."""
    _show(_hosts(ctx, redis_url, crawl_name, key).set(key, block_until=None), as_json)


@hosts_app.command("reset")
@_guard
@_bad_input
def reset(
    ctx: typer.Context,
    key: KeyArg,
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    as_json: AsJson = False,
) -> None:
    """Drop the operator's override of a key (robots.txt's Crawl-delay and AutoThrottle's
    delay stay)."""
    _show(_hosts(ctx, redis_url, crawl_name, key).reset(key), as_json)
