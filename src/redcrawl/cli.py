"""The ``redcrawl`` command: run workers, watch a crawl, seed it, inspect its dead letters.

Every command works on one crawl (``--crawl``; for ``crawl`` the default is the spider's
name) in one Redis (``--redis-url``, default: the embedded Redis in ``./.redcrawl``).
Settings come from the
Scrapy project (when run inside one), then ``REDCRAWL_*`` environment variables, then
flags. Exit codes: 0 ok, 1 the crawl or a worker failed, 2 bad usage or configuration,
3 Redis unreachable, 130 interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from redcrawl.connection import connect, resolve_url
from redcrawl.errors import ConfigError, ConnectionError_, RedcrawlError
from redcrawl.frontier import Counts, ListsFrontier, open_frontier
from redcrawl.settings import Settings

app = typer.Typer(
    help="A distributed crawl frontier for Scrapy on Redis.\n\n"
    "Start with `redcrawl demo` (a crawl of a bundled local shop site), or inside a Scrapy "
    "project `redcrawl crawl SPIDER --workers 4`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)

RedisUrl = Annotated[str | None, typer.Option(
    "--redis-url", envvar="REDCRAWL_REDIS_URL",
    help="Redis to use, e.g. redis://host:6379/0. Default: the embedded Redis in ./.redcrawl.")]
CrawlName = Annotated[str | None, typer.Option(
    "--crawl", envvar="REDCRAWL_CRAWL", help="Crawl name (default: the spider's name).")]

EXIT_FAILED, EXIT_USAGE, EXIT_REDIS, EXIT_INTERRUPTED = 1, 2, 3, 130


def _settings(redis_url: str | None, **changes: Any) -> Settings:
    """Project settings (if in a Scrapy project), then REDCRAWL_* env, then flags."""
    base: Settings
    if os.path.exists("scrapy.cfg") or os.environ.get("SCRAPY_SETTINGS_MODULE"):
        from scrapy.utils.project import get_project_settings

        base = Settings.from_scrapy(get_project_settings())
    else:
        base = Settings.from_env()
    if redis_url:
        changes["redis_url"] = redis_url
    return base.replace(**{k: v for k, v in changes.items() if v is not None})


def _frontier(settings: Settings, crawl: str) -> ListsFrontier:
    return open_frontier(connect(settings), settings, crawl, follow_layout=True)


def _fail(message: str, code: int) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _guard(fn: Any) -> Any:
    """Turn redcrawl's errors into messages and exit codes."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            raise _fail(str(exc), EXIT_USAGE) from None
        except ConnectionError_ as exc:
            raise _fail(str(exc), EXIT_REDIS) from None
        except RedcrawlError as exc:
            raise _fail(str(exc), EXIT_FAILED) from None

    return wrapper


# --- crawl -------------------------------------------------------------------------------

def _worker_command(spider: str, settings_args: list[str],
                    spider_args: list[str] | None = None) -> list[str]:
    if spider.endswith(".py"):
        cmd = [sys.executable, "-m", "scrapy", "runspider", spider]
    else:
        cmd = [sys.executable, "-m", "scrapy", "crawl", spider]
    cmd += ["-s", "SCHEDULER=redcrawl.scrapy.Scheduler",
            "-s", "DUPEFILTER_CLASS=redcrawl.scrapy.DupeFilter"]
    for item in settings_args:
        cmd += ["-s", item]
    for item in spider_args or []:
        cmd += ["-a", item]
    return cmd


def _spider_name(spider: str) -> str:
    """The spider's name: from a file's ``name = "..."``, else the argument itself."""
    if spider.endswith(".py"):
        import re

        text = Path(spider).read_text(encoding="utf-8")
        found = re.search(r"""^\s+name\s*=\s*["']([^"']+)["']""", text, re.M)
        return found.group(1) if found else Path(spider).stem
    return spider


class Progress:
    """One live line: pages, items, queue, in flight, retries, dead, rate."""

    def __init__(self, frontier: ListsFrontier) -> None:
        self.frontier = frontier
        self.start = time.monotonic()
        self.samples: list[tuple[float, int]] = []

    def render(self) -> Text:
        c = self.frontier.counts()
        stats = self.frontier.stats()
        now = time.monotonic()
        self.samples = [(t, d) for t, d in self.samples if now - t < 10] + [(now, c.done)]
        t0, d0 = self.samples[0]
        rate = (c.done - d0) / (now - t0) if now > t0 else 0.0
        width = 20
        filled = int(width * (c.done + c.dead) / max(c.accepted, 1))
        line = Text()
        line.append("█" * filled, style="green")
        line.append("░" * (width - filled), style="dim")
        line.append(f" pages {c.done:,} | items {stats.get('items', 0):,} | "
                    f"queue {c.ready + c.delayed:,} | in flight {c.in_flight:,} | "
                    f"retries {c.retried:,} | dead {c.dead:,} | {rate:,.0f}/s | "
                    f"{now - self.start:,.0f}s")
        return line


def run_workers(spider: str, *, workers: int, settings: Settings, crawl: str,
                settings_args: list[str], cwd: str | None = None,
                progress: bool = True, env: dict[str, str] | None = None,
                spider_args: list[str] | None = None) -> int:
    """Start ``workers`` Scrapy processes on one frontier; wait for the crawl to finish.
    Returns an exit code."""
    from rich.live import Live

    from redcrawl.guard import check_server

    url = resolve_url(settings)  # starts the embedded Redis if that is what is configured
    frontier = open_frontier(connect(settings, url=url), settings, crawl)
    try:
        warnings = check_server(frontier)  # an evicting server: refused here, once
    except ConfigError:
        frontier.client.close()
        raise
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    base_env = {**os.environ, **(env or {}), "REDCRAWL_REDIS_URL": url, "REDCRAWL_CRAWL": crawl}
    cmd = _worker_command(spider, settings_args, spider_args)
    host = socket.gethostname()
    procs = [
        subprocess.Popen(cmd, cwd=cwd, start_new_session=True,
                         env={**base_env, "REDCRAWL_WORKER_ID": f"{host}:{crawl}:w{i}"},
                         stdout=subprocess.DEVNULL if progress else None,
                         stderr=subprocess.PIPE if progress else None)
        for i in range(workers)
    ]
    interrupted = 0

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted += 1
        for p in procs:
            if p.poll() is None:
                # once: Scrapy finishes what it holds; twice: it stops at once (and its
                # leases come back by themselves)
                p.send_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_sigint)
    view = Progress(frontier)
    done = False
    try:
        with Live(view.render(), console=console, refresh_per_second=4,
                  transient=False) if progress else _nullcontext() as live:
            while any(p.poll() is None for p in procs):
                time.sleep(0.25)
                if live is not None:
                    live.update(view.render())
        done = True
    finally:
        signal.signal(signal.SIGINT, previous)
        if not done:  # this process failed: don't leave workers running without a parent
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                p.wait()
    failed = [p for p in procs if p.returncode not in (0, None)]
    if failed and progress:
        for p in failed:
            tail = (p.stderr.read() if p.stderr else b"").decode(errors="replace")[-2000:]
            console.print(f"[red]worker exited with {p.returncode}[/]\n{tail}")
    for p in procs:
        if p.stderr:
            p.stderr.close()
    if interrupted:
        console.print("interrupted: run the same command again to resume the crawl")
        return EXIT_INTERRUPTED
    return EXIT_FAILED if failed else 0


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@app.command()
@_guard
def crawl(
    spider: Annotated[str, typer.Argument(
        help="Spider name (inside a Scrapy project) or path to a spider .py file.")],
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, max=256,
                                         help="Worker processes to start.")] = 2,
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    setting: Annotated[list[str] | None, typer.Option(
        "--set", "-s", help="A Scrapy/redcrawl setting for the workers, NAME=VALUE.")] = None,
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", "-a", help="A spider argument, NAME=VALUE (as scrapy crawl -a).")] = None,
    progress: Annotated[bool, typer.Option(help="Show the live progress line.")] = True,
) -> None:
    """Run SPIDER in N local worker processes on one shared frontier until the whole
    crawl is finished. Ctrl-C stops cleanly (a second Ctrl-C at once); run the same
    command again to resume."""
    for flag, items in (("--set", setting), ("--arg", arg)):
        for item in items or []:
            if "=" not in item:
                raise ConfigError(flag, f"{item!r} is not NAME=VALUE")
    # the workers' redcrawl settings given with --set apply here too (progress, counts)
    settings = Settings.from_mapping(dict(item.split("=", 1) for item in setting or []),
                                     base=_settings(redis_url))
    name = crawl_name or settings.crawl_name(_spider_name(spider))
    code = run_workers(spider, workers=workers, settings=settings, crawl=name,
                       settings_args=setting or [], spider_args=arg, progress=progress)
    _print_counts(_frontier(settings, name).counts(), name)
    raise typer.Exit(code)


# --- inspection and operator actions ------------------------------------------------------

def _print_counts(c: Counts, crawl: str) -> None:
    table = Table(title=f"crawl {crawl}", show_header=False)
    for label, value in (("accepted", c.accepted), ("duplicates filtered", c.filtered),
                         ("ready", c.ready), ("delayed (retry)", c.delayed),
                         ("in flight", c.in_flight), ("done", c.done), ("dead", c.dead),
                         ("retries", c.retried), ("reclaimed leases", c.reclaimed)):
        table.add_row(label, f"{value:,}")
    table.add_row("state", "finished" if c.finished else "running / pending")
    Console().print(table)


def _require_crawl(crawl_name: str | None) -> str:
    if not crawl_name:
        raise ConfigError("--crawl", "name the crawl (--crawl NAME or REDCRAWL_CRAWL)")
    return crawl_name


@app.command()
@_guard
def status(redis_url: RedisUrl = None, crawl_name: CrawlName = None,
           as_json: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False,
           ) -> None:
    """Show a crawl's counts: ready, delayed, in flight, done, dead, and its workers."""
    settings = _settings(redis_url)
    name = _require_crawl(crawl_name)
    frontier = _frontier(settings, name)
    c = frontier.counts()
    now = time.time()
    workers = {w: until - now for w, until in frontier.workers().items()}
    if as_json:
        out = {**{f: getattr(c, f) for f in c.__dataclass_fields__}, "finished": c.finished,
               "workers": {w: {"alive": left > 0} for w, left in workers.items()},
               "paused": frontier.is_paused()}
        typer.echo(json.dumps(out))
        return
    _print_counts(c, name)
    for w, left in sorted(workers.items()):
        state = f"alive ({left:.0f}s of heartbeat left)" if left > 0 else "gone"
        typer.echo(f"worker {w}: {state}")


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
    """Put start URLs straight into a crawl's frontier (durable, deduplicated)."""
    from redcrawl.scrapy.scheduler import seed as push_seeds

    items = list(urls or [])
    if file is not None:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
        items += [line.strip() for line in text.splitlines() if line.strip()]
    bad = [u for u in items if not u.startswith(("http://", "https://"))]
    if bad:
        raise ConfigError("URL", f"{bad[0]!r} is not an http(s) URL; nothing was seeded")
    if not items:
        raise ConfigError("URL", "give URLs as arguments or with --file")
    settings = _settings(redis_url)
    result = push_seeds(items, settings=settings, crawl=_require_crawl(crawl_name),
                        callback=callback, priority=priority, recrawl=recrawl)
    typer.echo(f"seeded {result.accepted} URL(s); {result.filtered} already known")


@app.command()
@_guard
def dead(
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    limit: Annotated[int, typer.Option(min=1, help="How many to list.")] = 50,
    requeue: Annotated[bool, typer.Option(
        "--requeue", help="Send the listed dead requests back to the queue.")] = False,
) -> None:
    """List dead-lettered requests with their last error; --requeue sends them back."""
    frontier = _frontier(_settings(redis_url), _require_crawl(crawl_name))
    rows = frontier.dead(limit)
    for d in rows:
        typer.echo(f"{d.id}  {d.url}  attempts={d.attempts}  {d.error}")
    if not rows:
        typer.echo("no dead requests")
    if requeue and rows:
        n = frontier.requeue_dead([d.id for d in rows])
        typer.echo(f"requeued {n}")


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
    frontier = _frontier(settings, _require_crawl(crawl_name))
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
    name = _require_crawl(crawl_name)
    frontier = _frontier(_settings(redis_url), name)
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
        "--dir", help="Where the embedded Redis and the SQLite results go.")] = Path(
        ".redcrawl-demo"),
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


__all__ = ["app", "main", "run_workers"]
