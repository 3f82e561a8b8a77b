"""The ``redcrawl`` command: run workers, watch a crawl, seed it, inspect its dead letters.

A thin layer over the library: :mod:`redcrawl.workers` runs and supervises the worker
processes, the frontier does the rest. Every command works on one crawl (``--crawl``) in
one Redis (``--redis-url``, default: the embedded Redis in ``./.redcrawl``). Settings come
from the Scrapy project (when run inside one), then ``REDCRAWL_*`` environment variables,
then flags. Commands that only look at a crawl never start the embedded Redis on a folder
that holds no crawl. Exit codes (:class:`~redcrawl.workers.ExitCode`): 0 ok, 1 the crawl
or a worker failed, 2 bad usage or configuration, 3 Redis unreachable or no crawl state
found, 4 dead letters with ``crawl --fail-on-dead``, 128+N stopped by signal N (130
Ctrl-C, 143 SIGTERM, 129 SIGHUP). docs/cli.md describes every command.

(Over 450 lines: one short function per command, eleven commands, and the rules that
pick the crawl and the Redis; no supervision or frontier logic lives here.)
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import redis
import typer
from rich.console import Console
from rich.table import Table

from redcrawl.connection import EmbeddedRedis, connect, redact, resolve_url
from redcrawl.errors import ConfigError, ConnectionError_, RedcrawlError
from redcrawl.frontier import Counts, open_frontier
from redcrawl.keys import CrawlKeys, crawl_of_stats_key, stats_key_pattern, validate_crawl_name
from redcrawl.progress import ProgressDisplay
from redcrawl.settings import Settings
from redcrawl.workers import (
    ExitCode,
    UnknownSpider,
    WorkerEvent,
    check_spider,
    in_scrapy_project,
    project_spiders,
    run_workers,
)

app = typer.Typer(
    help="A distributed crawl frontier for Scrapy on Redis.\n\n"
    "Start with `redcrawl demo` (a crawl of a bundled local shop site), or inside a Scrapy "
    "project `redcrawl crawl SPIDER --workers 4`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstrings' line breaks are not kept
)
console = Console(stderr=True)

RedisUrl = Annotated[str | None, typer.Option(
    "--redis-url", envvar="REDCRAWL_REDIS_URL",
    help="Redis to use, e.g. redis://host:6379/0. Default: the embedded Redis in ./.redcrawl.")]
CrawlName = Annotated[str | None, typer.Option(
    "--crawl", envvar="REDCRAWL_CRAWL",
    help="Crawl name. Default: the project's REDCRAWL_CRAWL, else its spider if it has "
    "only one, else the only crawl in the Redis.")]

EXIT_FAILED, EXIT_USAGE, EXIT_REDIS = ExitCode.FAILED, ExitCode.USAGE, ExitCode.REDIS
EXIT_DEAD_LETTERS = ExitCode.DEAD_LETTERS


def _settings(redis_url: str | None, **changes: Any) -> Settings:
    """Project settings (if in a Scrapy project), then REDCRAWL_* env, then flags."""
    base: Settings
    if in_scrapy_project():
        from scrapy.utils.project import get_project_settings

        base = Settings.from_scrapy(get_project_settings())
    else:
        base = Settings.from_env()
    if redis_url:
        changes["redis_url"] = redis_url
    return base.replace(**{k: v for k, v in changes.items() if v is not None})


def _fail(message: str, code: int) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _guard(fn: Any) -> Any:
    """Turn redcrawl's errors into messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ConfigError, UnknownSpider) as exc:
            raise _fail(str(exc), EXIT_USAGE) from None
        except ConnectionError_ as exc:
            raise _fail(str(exc), EXIT_REDIS) from None
        except RedcrawlError as exc:
            raise _fail(str(exc), EXIT_FAILED) from None

    return wrapper


# --- where the crawl state is ------------------------------------------------------------

def _has_data(directory: Path) -> bool:
    """Whether an embedded Redis folder holds saved data (AOF or RDB)."""
    return any((directory / name).exists()
               for name in ("appendonlydir", "appendonly.aof", "dump.rdb"))


def _state_exists(settings: Settings) -> bool:
    """Whether there is crawl state to look at without making any: a Redis URL is set, or
    the embedded Redis runs in its folder or has saved data there."""
    if settings.redis_url is not None:
        return True
    server = EmbeddedRedis(settings.embedded_dir)
    return server._alive() or _has_data(server.directory)


def _connect(settings: Settings, *, create: bool = False) -> redis.Redis:
    """A client of the crawl's Redis. With the embedded default, an inspection
    (``create`` off) never brings up a fresh server: if none runs in the folder and the
    folder holds no saved data, it is an error (exit 3) and no folder is made."""
    if not create and not _state_exists(settings):
        raise _fail(f"no crawl state found at {settings.embedded_dir.resolve()} (embedded "
                    "Redis not running); run from the crawl's folder or set "
                    "REDCRAWL_REDIS_URL", EXIT_REDIS)
    return connect(settings, url=resolve_url(settings))


def _where(settings: Settings) -> str:
    if settings.redis_url:
        return redact(settings.redis_url)
    return f"the embedded Redis in {settings.embedded_dir.resolve()}"


def _crawls(client: redis.Redis, prefix: str) -> list[str]:
    """Every crawl in the Redis (each one that ever accepted a request has a stats hash):
    one SCAN matching the stats keys only."""
    names = {crawl_of_stats_key(k, prefix)
             for k in client.scan_iter(match=stats_key_pattern(prefix), count=1000)}
    return sorted(n for n in names if n is not None)


def _crawl(settings: Settings, given: str | None, client: redis.Redis | None) -> str:
    """The crawl a command works on: ``--crawl``/``REDCRAWL_CRAWL``, else the project's
    setting, else the project's only spider, else the only crawl in the Redis."""
    if given:
        return validate_crawl_name(given)
    spiders = project_spiders()
    if settings.crawl is not None and ("%(" not in settings.crawl or len(spiders) == 1):
        return settings.crawl_name(spiders[0] if spiders else None)
    if len(spiders) == 1:
        return settings.crawl_name(spiders[0])
    crawls = _crawls(client, settings.key_prefix) if client is not None else []
    if len(crawls) == 1 and not spiders:
        return crawls[0]
    known = (f"this project's spiders: {', '.join(spiders)}; " if spiders else "")
    here = (f"crawls in {_where(settings)}: {', '.join(crawls)}" if crawls
            else f"{_where(settings)} holds no crawl")
    raise _fail(f"which crawl? Give --crawl NAME (or set REDCRAWL_CRAWL); {known}{here}",
                EXIT_USAGE)


def _existing(settings: Settings, client: redis.Redis, name: str) -> None:
    if not client.exists(CrawlKeys(name, prefix=settings.key_prefix).stats):
        crawls = _crawls(client, settings.key_prefix)
        listed = f"crawls there: {', '.join(crawls)}" if crawls else "it holds no crawl"
        raise _fail(f"no crawl named {name!r} in {_where(settings)}; {listed}", EXIT_FAILED)


def _state(frontier: Any, c: Counts) -> str:
    """finished / running / paused / stopped, with the number of live workers."""
    if c.finished and c.accepted:
        return "finished"
    now = frontier.server_time()
    live = sum(1 for until in frontier.workers().values() if until > now)
    paused = frontier.is_paused()
    if live:
        return f"{'paused' if paused else 'running'} ({live} live worker{'s' * (live != 1)})"
    if not c.accepted:
        return "empty (nothing accepted; no live workers)"
    return "paused, no live workers" if paused else "stopped (no live workers)"


def _print_counts(c: Counts, crawl: str, stats: dict[str, int], state: str) -> None:
    table = Table(title=f"crawl {crawl}", show_header=False)
    local = stats.get("filtered_local", 0)
    dupes = f"{c.filtered + local:,}"
    if local:
        dupes += f" ({c.filtered:,} in Redis, {local:,} in the workers)"
    for label, value in (("accepted", f"{c.accepted:,}"), ("duplicates filtered", dupes),
                         ("ready", f"{c.ready:,}"), ("delayed (retry)", f"{c.delayed:,}"),
                         ("in flight", f"{c.in_flight:,}"), ("done", f"{c.done:,}"),
                         ("dead", f"{c.dead:,}"), ("items", f"{stats.get('items', 0):,}"),
                         ("retries", f"{c.retried:,}"),
                         ("reclaimed leases", f"{c.reclaimed:,}"), ("state", state)):
        table.add_row(label, value)
    Console().print(table)


# --- crawl -------------------------------------------------------------------------------

def _show(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _on_event(event: WorkerEvent, logs: Path | None) -> None:
    style = {"failed": "bold red", "restarting": "yellow", "exited": "yellow",
             "released": "yellow"}.get(event.kind, "bold")
    console.print(f"[{style}]{event.message}[/]", highlight=False)
    if event.log_tail and event.kind == "failed":
        where = f" ({_show(logs / f'{event.worker}.log')})" if logs else ""
        console.print(f"[dim]--- end of {event.worker}'s log{where}:[/]")
        console.print(event.log_tail, markup=False, highlight=False)


@app.command()
@_guard
def crawl(
    spider: Annotated[str, typer.Argument(
        help="Spider name (inside a Scrapy project) or path to a spider .py file.")],
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, max=256,
                                         help="Worker processes to start.")] = 2,
    redis_url: RedisUrl = None,
    crawl_name: Annotated[str | None, typer.Option(
        "--crawl", envvar="REDCRAWL_CRAWL",
        help="Crawl name (default: the spider's name).")] = None,
    setting: Annotated[list[str] | None, typer.Option(
        "--set", "-s", help="A Scrapy/redcrawl setting for the workers, NAME=VALUE.")] = None,
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", "-a", help="A spider argument, NAME=VALUE (as scrapy crawl -a).")] = None,
    logs: Annotated[str | None, typer.Option(
        "--logs", help="Folder for the workers' logs (w0.log, w1.log, ...; default "
        ".redcrawl/logs/CRAWL); '-' sends them to this terminal instead.")] = None,
    max_restarts: Annotated[int, typer.Option(
        min=0, help="Restarts of a crashed worker, with backoff (1 s, 2 s, 4 s, ...).")] = 5,
    fail_on_dead: Annotated[bool, typer.Option(
        "--fail-on-dead", help="Exit with 4 when the crawl ends with dead letters.")] = False,
    progress: Annotated[bool, typer.Option(help="Show the live progress line.")] = True,
) -> None:
    """Run SPIDER in N local worker processes on one shared frontier until the whole
    crawl is finished. Ctrl-C, SIGTERM or SIGHUP stops the workers cleanly (a second
    signal kills them); run the same command again to resume. A crashed worker is
    restarted. Each worker's output goes to its log file."""
    for flag, items in (("--set", setting), ("--arg", arg)):
        for item in items or []:
            if "=" not in item:
                raise _fail(f"{flag} {item!r}: give NAME=VALUE", EXIT_USAGE)
    name = check_spider(spider)  # before anything starts: exit 2 with the spider list
    # the workers' redcrawl settings given with --set apply here too (progress, counts)
    settings = Settings.from_mapping(dict(item.split("=", 1) for item in setting or []),
                                     base=_settings(redis_url))
    crawl_id = validate_crawl_name(crawl_name) if crawl_name else settings.crawl_name(name)
    log_dir = (None if logs == "-" else
               Path(logs) if logs else settings.embedded_dir / "logs" / crawl_id)
    if log_dir is not None:
        console.print(f"worker logs: {_show(log_dir / 'w0.log')}"
                      + (f" ... w{workers - 1}.log" if workers > 1 else ""), highlight=False)
    display = ProgressDisplay(console) if progress and log_dir is not None else None
    with display if display is not None else contextlib.nullcontext():
        result = run_workers(spider, workers=workers, settings=settings, crawl=crawl_id,
                             settings_args=setting or [], spider_args=arg or [],
                             log_dir=log_dir, progress=display,
                             on_event=lambda e: _on_event(e, log_dir),
                             max_restarts=max_restarts)
    client = connect(settings)
    frontier = open_frontier(client, settings, crawl_id)
    c = frontier.counts()
    _print_counts(c, crawl_id, frontier.stats(), _state(frontier, c))
    if log_dir is not None:
        console.print(f"worker logs: {_show(log_dir)}/", highlight=False)
    code = result.code
    if result.signal is not None:
        console.print("stopped: run the same command again to resume the crawl")
    elif code == 0 and fail_on_dead and c.dead:
        console.print(f"[red]{c.dead:,} dead letter(s)[/]: see `redcrawl dead --crawl "
                      f"{crawl_id}`")
        code = EXIT_DEAD_LETTERS
    raise typer.Exit(code)


# --- inspection and operator actions ------------------------------------------------------

@app.command()
@_guard
def status(redis_url: RedisUrl = None, crawl_name: CrawlName = None,
           as_json: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False,
           ) -> None:
    """Show a crawl's counts (ready, delayed, in flight, done, dead), its state and its
    workers, and where its Redis listens."""
    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    _existing(settings, client, name)
    frontier = open_frontier(client, settings, name, follow_layout=True)
    c = frontier.counts()
    stats = frontier.stats()
    state = _state(frontier, c)
    now = frontier.server_time()
    workers = {w: until - now for w, until in frontier.workers().items()}
    sock = None if settings.redis_url else EmbeddedRedis(settings.embedded_dir).socket
    if as_json:
        out = {**{f: getattr(c, f) for f in c.__dataclass_fields__}, "finished": c.finished,
               "filtered_local": stats.get("filtered_local", 0), "items": stats.get("items", 0),
               "state": state, "paused": frontier.is_paused(),
               "workers": {w: {"alive": left > 0} for w, left in workers.items()},
               "redis": {"url": redact(settings.redis_url) if settings.redis_url else None,
                         "socket": str(sock) if sock else None}}
        typer.echo(json.dumps(out))
        return
    _print_counts(c, name, stats, state)
    for w, left in sorted(workers.items()):
        typer.echo(f"worker {w}: "
                   + (f"alive ({left:.0f}s of heartbeat left)" if left > 0 else "gone"))
    if sock is not None:
        typer.echo(f"embedded Redis: unix socket {sock} (redis-cli -s {sock})")
    else:
        typer.echo(f"Redis: {_where(settings)}")


@app.command("crawls")
@_guard
def list_crawls(redis_url: RedisUrl = None,
                as_json: Annotated[bool, typer.Option("--json", help="Machine-readable.")]
                = False) -> None:
    """List the crawls in the Redis with their counts and state."""
    settings = _settings(redis_url)
    client = _connect(settings)
    rows = []
    for name in _crawls(client, settings.key_prefix):
        frontier = open_frontier(client, settings, name, follow_layout=True)
        c = frontier.counts()
        rows.append((name, c, _state(frontier, c)))
    if as_json:
        typer.echo(json.dumps([{"crawl": n, "accepted": c.accepted, "done": c.done,
                                "pending": c.pending, "dead": c.dead, "state": s}
                               for n, c, s in rows]))
        return
    if not rows:
        typer.echo(f"no crawls in {_where(settings)}")
        return
    table = Table("crawl", "accepted", "done", "pending", "dead", "state")
    for n, c, s in rows:
        table.add_row(n, f"{c.accepted:,}", f"{c.done:,}", f"{c.pending:,}", f"{c.dead:,}", s)
    Console().print(table)


@app.command()
@_guard
def seed(
    urls: Annotated[list[str] | None, typer.Argument(help="URLs to crawl.")] = None,
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", help="Read URLs from a file, one per line ('-': stdin).")] = None,
    callback: Annotated[str | None, typer.Option(
        help="Spider method to parse them with (default: parse).")] = None,
    priority: Annotated[int, typer.Option(help="Request priority.")] = 0,
    recrawl: Annotated[bool, typer.Option(
        "--recrawl", help="Crawl URLs again even if they are done (not if still queued).")
    ] = False,
) -> None:
    """Put start URLs straight into a crawl's frontier (durable, deduplicated). Starts
    the embedded Redis if need be: seeding before the first crawl is fine."""
    from redcrawl.scrapy.scheduler import seed as push_seeds

    items = list(urls or [])
    if file is not None:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
        items += [line.strip() for line in text.splitlines() if line.strip()]
    bad = [u for u in items if not u.startswith(("http://", "https://"))]
    if bad:
        raise _fail(f"{bad[0]!r} is not an http(s) URL; nothing was seeded", EXIT_USAGE)
    if not items:
        raise _fail("give URLs as arguments or with --file", EXIT_USAGE)
    settings = _settings(redis_url)
    name = _crawl(settings, crawl_name, _connect(settings) if _state_exists(settings) else None)
    client = _connect(settings, create=True)
    result = push_seeds(items, settings=settings, crawl=name, callback=callback,
                        priority=priority, recrawl=recrawl, client=client)
    typer.echo(f"seeded {result.accepted} URL(s); {result.filtered} already known")


def _time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@app.command()
@_guard
def dead(
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    limit: Annotated[int, typer.Option(min=1, help="How many to list.")] = 50,
    requeue: Annotated[bool, typer.Option(
        "--requeue", help="Send the listed dead requests back to the queue.")] = False,
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
        typer.echo(f"paused crawl {name}: workers lease nothing new (what they hold is "
                   f"finished) until `redcrawl resume --crawl {name}`")
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


@app.command("import-dupefilter")
@_guard
def import_dupefilter(
    key: Annotated[str, typer.Argument(
        help="The scrapy-redis dupefilter set, e.g. myspider:dupefilter.")],
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    source_url: Annotated[str | None, typer.Option(
        "--source-url", help="Redis holding the set (default: the crawl's Redis).")] = None,
    batch: Annotated[int, typer.Option(min=1, max=100_000,
                                       help="Fingerprints per round trip.")] = 10_000,
) -> None:
    """Load a scrapy-redis dupefilter (a set of hex SHA-1 fingerprints) into a crawl's
    DONE filter, so a crawl moving over from scrapy-redis does not refetch what it has.
    Streams with SSCAN (the source may be live); safe to run again after switching."""
    from redcrawl.dedupe import import_hex_set

    settings = _settings(redis_url)
    name = _crawl(settings, crawl_name, _connect(settings) if _state_exists(settings) else None)
    frontier = open_frontier(_connect(settings, create=True), settings, name,
                             follow_layout=True)
    if settings.canonicalize:
        console.print("[yellow]warning:[/] REDCRAWL_CANONICALIZE is on: this crawl's "
                      "fingerprints differ from scrapy-redis's, so imported ones will not "
                      "match new requests")
    source = frontier.client if source_url is None else connect(settings, url=source_url)
    try:
        from redcrawl.migrate import dupefilter_import_warnings

        for warning in dupefilter_import_warnings(source, key, frontier):
            console.print(f"[yellow]warning:[/] {warning}")
        result = import_hex_set(source, key, frontier.done, batch=batch,
                                progress=lambda n: console.print(f"read {n:,}", end="\r"))
    finally:
        source.close()
        frontier.client.close()
    typer.echo(f"read {result.read:,} fingerprints from {key}: {result.added:,} added, "
               f"{result.read - result.added - result.invalid:,} already there, "
               f"{result.invalid:,} invalid")
    if result.invalid:
        console.print(f"[yellow]skipped {result.invalid:,} member(s) that are not 40 hex "
                      f"digits, e.g. {result.example!r}[/]")


@app.command()
@_guard
def purge(
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Don't ask.")] = False,
) -> None:
    """Delete a crawl's whole state: queue, leases, dead letters, fingerprints."""
    settings = _settings(redis_url)
    client = _connect(settings)
    name = _crawl(settings, crawl_name, client)
    frontier = open_frontier(client, settings, name, follow_layout=True)
    if not yes and not typer.confirm(f"Delete everything of crawl {name!r}?"):
        raise typer.Exit(EXIT_FAILED)
    frontier.purge()
    typer.echo(f"purged crawl {name}")


@app.command()
@_guard
def demo(
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, max=32)] = 4,
    products: Annotated[int, typer.Option(help="Product pages in the demo shop.")] = 3000,
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where the embedded Redis, the worker logs and the SQLite results "
        "go.")] = Path(".redcrawl-demo"),
    progress: Annotated[bool, typer.Option(help="Show the live progress line.")] = True,
) -> None:
    """Crawl a bundled shop site (served on loopback) with N workers on the embedded
    Redis, then report pages, items, duplicates, retries and dead letters."""
    from redcrawl.demo.run import run_demo

    raise typer.Exit(run_demo(workers=workers, products=products, directory=directory,
                              progress=progress))


@app.command()
@_guard
def serve(
    redis_url: RedisUrl = None,
    host: Annotated[str | None, typer.Option(
        help="Address to bind (REDCRAWL_API_HOST, default 127.0.0.1). Binding beyond "
        "loopback needs API tokens.")] = None,
    port: Annotated[int | None, typer.Option(
        help="Port (REDCRAWL_API_PORT, default 8700).")] = None,
) -> None:
    """Run the HTTP control plane: submit requests, inspect and steer crawls (/v1, OpenAPI
    schema at /openapi.json). Tokens: REDCRAWL_API_TOKENS (read) and
    REDCRAWL_API_ADMIN_TOKENS (admin)."""
    from redcrawl.api import serve as run_server

    run_server(_settings(redis_url, api_host=host, api_port=port))


def main() -> None:
    app()


if __name__ == "__main__":
    main()


__all__ = ["app", "main"]
