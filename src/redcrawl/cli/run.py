"""``redcrawl crawl``, ``demo``, ``serve`` and ``stop-embedded``: commands that run
something."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from redcrawl.cli._common import (
    EXIT_DEAD_LETTERS,
    EXIT_FAILED,
    EXIT_UNFINISHED,
    EXIT_USAGE,
    RedisUrl,
    _fail,
    _guard,
    _print_counts,
    _settings,
    _state,
    _stoppable,
    app,
    console,
)
from redcrawl.connection import connect, stop_embedded
from redcrawl.errors import LayoutMismatch, RedcrawlError, partitions_lost_text
from redcrawl.feeds import for_worker, output_problem, remove_parts
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.frontier.final import (
    COMMAND_PURGES_ENV,
    purge_if_finished,
    read_final,
    server_ms,
)
from redcrawl.frontier.records import stored_layout
from redcrawl.keys import validate_crawl_name
from redcrawl.politeness.describe import fleet_limits
from redcrawl.progress import ProgressDisplay
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors
from redcrawl.workers import (
    FleetResult,
    Tick,
    WorkerEvent,
    check_spider,
    claim_log_dir,
    run_workers,
    spider_settings,
)

# --- crawl -------------------------------------------------------------------------------


def _show(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _on_event(event: WorkerEvent, logs: Path | None) -> None:
    style = {
        "failed": "bold red",
        "restarting": "yellow",
        "exited": "yellow",
        "released": "yellow",
    }.get(event.kind, "bold")
    console.print(f"[{style}]{event.message}[/]", highlight=False)
    where = f" ({_show(logs / f'{event.worker}.log')})" if logs else ""
    if event.problems:  # why it failed: said before its closing stats dump, shown here
        console.print(f"[dim]--- {event.worker}'s errors{where}:[/]")
        console.print(event.problems, markup=False, highlight=False)
    elif event.log_tail and event.kind == "failed":
        console.print(f"[dim]--- end of {event.worker}'s log{where}:[/]")
        console.print(event.log_tail, markup=False, highlight=False)


def _check_layout(settings: Settings, crawl: str) -> None:
    """An existing crawl's layout (backend, ordering, politeness, dedupe) is fixed when it
    is created: refuse here, once and before any worker starts, settings that change it
    (e.g. REDCRAWL_POLITENESS=off to go faster), rather than have every worker die at
    start with a traceback. Checked by the frontier's own scripts (a maintenance step, as
    every worker runs); a new crawl is left for the workers to create."""
    client = connect(settings)
    try:
        # (a partitioned crawl's partition count is checked by open_frontier itself)
        frontier = open_frontier(client, settings, crawl)
        if stored_layout(frontier.client.hgetall(frontier.keys.control)) is None:
            return
        frontier.maintain()
    except LayoutMismatch as exc:
        what = (
            "by a newer redcrawl than this one"
            if exc.newer_redcrawl
            else ("with other settings than these")
        )
        raise _fail(f"crawl {crawl} was created {what}: {exc}", EXIT_USAGE) from None
    finally:
        client.close()


def _politeness(settings: Settings, crawl: str, workers: int) -> str:
    """One line on what the per-site settings mean for this crawl: the workers' logs say
    it too, but they go to files, and a migrated scrapy-redis project's sites are
    crawled more slowly when its limits hold for the whole fleet."""
    if not settings.politeness:
        return "per-site limits: each worker limits itself (REDCRAWL_POLITENESS=off): " + (
            f"{workers} workers take up to {workers}x CONCURRENT_REQUESTS_PER_DOMAIN of a site"
            if workers != 1
            else "1 worker takes up to CONCURRENT_REQUESTS_PER_DOMAIN of a site"
        )
    frontier = open_frontier(connect(settings), settings, crawl)
    try:
        created_without = frontier.politeness is None
        change = "" if created_without else _limits_change(frontier, settings)
    finally:
        frontier.client.close()
    if created_without:
        return (
            f"per-site limits: crawl {crawl} was created without fleet-wide politeness, each "
            "worker limits itself (as with REDCRAWL_POLITENESS=off); purge it or use a new "
            "--crawl to have the limits hold for the fleet"
        )
    many = "this worker" if workers == 1 else f"these {workers} workers together"
    return (
        f"per-site limits for the whole fleet ({many}, and any other worker of the "
        f"crawl): {fleet_limits(settings)}. With "
        "scrapy-redis each worker took these: raise them for sites that can take more, or "
        f"set REDCRAWL_POLITENESS=off to have each worker take them again{change}"
    )


def _server_ms(settings: Settings) -> int:
    """Redis's clock now (ms)."""
    client = connect(settings)
    try:
        with redis_errors("reading the server's clock"):
            return server_ms(client)
    finally:
        client.close()


def _say_state(settings: Settings, crawl: str) -> None:
    """What would make a run end at once or wait forever, said here (the workers' notes go
    to their log files): a persistent crawl that is finished fetches nothing it has done;
    a paused one leases nothing until it is resumed."""
    frontier = open_frontier(connect(settings), settings, crawl)
    try:
        c, paused, lost = frontier.counts(), frontier.is_paused(), frontier.lost_partitions()
    finally:
        frontier.client.close()
    if lost:
        console.print(
            f"[bold red]error:[/] {partitions_lost_text(crawl, lost, settings.partitions)}",
            highlight=False,
            soft_wrap=True,
        )
    elif paused:
        console.print(
            f"[yellow]note:[/] crawl {crawl} is paused: its workers lease nothing until "
            f"`redcrawl resume --crawl {crawl}` (Ctrl-C stops them)",
            highlight=False,
        )
    elif c.finished and c.done:
        console.print(
            f"[yellow]note:[/] crawl {crawl} is finished ({c.done:,} done): its workers fetch "
            "only what is new (RedisSpider start URLs, `redcrawl seed --recrawl`); "
            f"`redcrawl purge --crawl {crawl}` starts it over",
            highlight=False,
        )


def _limits_change(frontier: FrontierCore, settings: Settings) -> str:
    """A warning when workers of the crawl are running with other default limits: the
    last worker to start sets them for the whole crawl (docs/politeness.md)."""
    now = frontier.server_time()
    if not any(until > now for until in frontier.workers().values()):
        return ""
    raw = frontier.client.hget(frontier.keys.control, "politeness")
    try:
        stored = json.loads(raw) if raw else None
    except ValueError:
        return ""
    if not isinstance(stored, dict):
        return ""
    mine = {
        "concurrency": settings.politeness_concurrency_per_ip or settings.politeness_concurrency,
        "delay": settings.politeness_delay,
        "randomize": settings.politeness_randomize,
    }
    if all(stored.get(k) == v for k, v in mine.items()):
        return ""
    return (
        f".\n[yellow]warning:[/] workers of crawl {frontier.crawl} are running with "
        f"concurrency {stored.get('concurrency')}, delay {stored.get('delay')} s, randomize "
        f"{stored.get('randomize')}; these workers change that for the whole crawl, theirs "
        f"too, to concurrency {mine['concurrency']}, delay {mine['delay']:g} s, randomize "
        f"{mine['randomize']}: give every worker the same CONCURRENT_REQUESTS_PER_DOMAIN, "
        "DOWNLOAD_DELAY and DOWNLOAD_DELAY_JITTER"
    )


def _outputs(output: list[str] | None, overwrite_output: list[str] | None) -> list[str]:
    """The feeds of ``-o`` or ``-O`` (not both), each checked (exit 2 naming the fix)."""
    if output and overwrite_output:
        raise _fail("use only one of -o/--output and -O/--overwrite-output", EXIT_USAGE)
    for item in output or overwrite_output or []:
        if (problem := output_problem(item)) is not None:
            raise _fail(f"{'-o' if output else '-O'} {problem}", EXIT_USAGE)
    return output or overwrite_output or []


def _prepare_outputs(outputs: list[str], *, overwrite: bool, workers: int) -> None:
    """``-O``: the files of an earlier run removed; then where the items go, said."""
    for item in outputs if overwrite else []:
        for old in remove_parts(item):
            console.print(f"-O: removed {_show(old)} (an earlier run's)", highlight=False)
    for item in outputs:
        last = f" ... {for_worker(item, f'w{workers - 1}')}" if workers > 1 else ""
        console.print(f"items: {for_worker(item, 'w0')}{last} (a file per worker)", highlight=False)


@app.command()
@_guard
@_stoppable
def crawl(
    spider: Annotated[
        str,
        typer.Argument(help="Spider name (inside a Scrapy project) or path to a spider .py file."),
    ],
    workers: Annotated[
        int, typer.Option("--workers", "-w", min=1, max=256, help="Worker processes to start.")
    ] = 2,
    redis_url: RedisUrl = None,
    crawl_name: Annotated[
        str | None,
        typer.Option(
            "--crawl", envvar="REDCRAWL_CRAWL", help="Crawl name (default: the spider's name)."
        ),
    ] = None,
    setting: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="A Scrapy/redcrawl setting for the workers, NAME=VALUE."),
    ] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", "-a", help="A spider argument, NAME=VALUE (as scrapy crawl -a)."),
    ] = None,
    output: Annotated[
        list[str] | None,
        typer.Option(
            "--output",
            "-o",
            help="Feed FILE (as scrapy crawl -o), one per worker: items.jsonl gives "
            "items.w0.jsonl, items.w1.jsonl, ...; appended to, also when resumed.",
        ),
    ] = None,
    overwrite_output: Annotated[
        list[str] | None,
        typer.Option(
            "--overwrite-output",
            "-O",
            help="As -o, but first remove the files of an earlier run (items.w*.jsonl).",
        ),
    ] = None,
    logs: Annotated[
        str | None,
        typer.Option(
            "--logs",
            help="Folder for the workers' logs (w0.log, w1.log, ...; default "
            ".redcrawl/logs/CRAWL); '-' sends them to this terminal instead.",
        ),
    ] = None,
    max_restarts: Annotated[
        int,
        typer.Option(
            min=0, help="Restarts of a crashed worker, with backoff (1 s, 2 s, 4 s, ...)."
        ),
    ] = 5,
    fail_on_dead: Annotated[
        bool,
        typer.Option("--fail-on-dead", help="Exit with 4 when the crawl ends with dead letters."),
    ] = False,
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
    outputs = _outputs(output, overwrite_output)
    name = check_spider(spider)  # before anything starts: exit 2 with the spider list
    # the workers' redcrawl settings given with --set apply here too (progress, counts)
    settings = Settings.from_mapping(
        dict(item.split("=", 1) for item in setting or []),
        base=_settings(redis_url, spider=spider_settings(spider)),
    )
    crawl_id = validate_crawl_name(crawl_name) if crawl_name else settings.crawl_name(name)
    _check_layout(settings, crawl_id)
    log_dir = (
        None if logs == "-" else Path(logs) if logs else settings.embedded_dir / "logs" / crawl_id
    )
    log_lock = contextlib.ExitStack()
    if log_dir is not None:
        # another `redcrawl crawl` here may be writing its logs there: take the next folder
        log_dir, lock = claim_log_dir(log_dir, or_next=not logs)
        log_lock.enter_context(lock)
        console.print(
            f"worker logs: {_show(log_dir / 'w0.log')}"
            + (f" ... w{workers - 1}.log" if workers > 1 else ""),
            highlight=False,
        )
    console.print(_politeness(settings, crawl_id, workers), highlight=False)
    _say_state(settings, crawl_id)
    started = _server_ms(settings)  # (final counts kept before this are an earlier run's)
    _prepare_outputs(outputs, overwrite=bool(overwrite_output), workers=workers)
    display = ProgressDisplay(console) if progress and log_dir is not None else None
    seen: list[Tick] = []  # the last counts read with something accepted

    def on_tick(tick: Tick) -> None:
        if tick.counts.accepted:
            seen[:] = [tick]
        if display is not None:
            display(tick)

    with log_lock, display if display is not None else contextlib.nullcontext():
        result = run_workers(
            spider,
            workers=workers,
            settings=settings,
            crawl=crawl_id,
            settings_args=setting or [],
            spider_args=arg or [],
            outputs=outputs,
            log_dir=log_dir,
            progress=on_tick,
            on_event=lambda e: _on_event(e, log_dir),
            max_restarts=max_restarts,
            # SCHEDULER_PERSIST off: the workers leave the crawl's removal to this command
            env=None if settings.persist else {COMMAND_PURGES_ENV: "1"},
        )
    if not settings.persist:
        _purge_finished(settings, crawl_id)
    raise typer.Exit(_report_end(settings, crawl_id, result, seen, log_dir, fail_on_dead, started))


def _purge_finished(settings: Settings, crawl_id: str) -> None:
    """SCHEDULER_PERSIST off: remove the crawl's state now that every worker of this
    command has exited, if the crawl is finished and no other worker of it is alive
    (another command's, a `scrapy crawl`: it removes it when it is done), leaving its
    counts for the report (frontier/final.py). Not done by the workers themselves: a
    worker that starts late, after the others finished a small crawl, found it removed
    and crawled it all over again."""
    frontier = open_frontier(connect(settings), settings, crawl_id)
    try:
        purged = purge_if_finished(frontier)
    except RedcrawlError as exc:
        console.print(
            f"[yellow]warning:[/] could not remove the finished crawl's state "
            f"(SCHEDULER_PERSIST is off): {escape(str(exc))}; `redcrawl purge --crawl "
            f"{crawl_id}` removes it",
            highlight=False,
            soft_wrap=True,
        )
        return
    finally:
        frontier.client.close()
    if purged is not None and purged[1] is not None:
        console.print(
            f"[yellow]warning:[/] could not keep the finished crawl's counts: "
            f"{escape(purged[1])}; the counts below are the ones last seen",
            highlight=False,
            soft_wrap=True,
        )


def _report_end(
    settings: Settings,
    crawl_id: str,
    result: FleetResult,
    seen: list[Tick],
    log_dir: Path | None,
    fail_on_dead: bool,
    started: int = 0,
) -> int:
    """The crawl's counts at its end, what is left to do, and the command's exit code.
    ``started``: when the command started (Redis's clock, ms), for the final counts."""
    client = connect(settings)
    frontier = open_frontier(client, settings, crawl_id)
    c = frontier.counts()
    lost = frontier.lost_partitions()
    gone = not c.accepted and not settings.persist  # (its last worker may have purged it)
    final = None
    if gone:
        with redis_errors("reading the crawl's final counts"):
            final = read_final(client, frontier.keys, started)
    removed = final is not None or (gone and bool(seen))
    dead = final[0].dead if final else seen[0].counts.dead if removed else c.dead
    if final is not None:
        # SCHEDULER_PERSIST off: this command (or the last worker of the crawl) removed its
        # state as it finished, leaving its counts (frontier/final.py)
        console.print(
            f"crawl {crawl_id} finished and its state was removed once its last worker was "
            "done (SCHEDULER_PERSIST is off): its counts as that worker left them",
            highlight=False,
            soft_wrap=True,
        )
        _print_counts(final[0], crawl_id, final[1], "removed at its end (SCHEDULER_PERSIST off)")
    elif removed:
        # (no counts left: a worker of an older version, or one that could not write
        # them) what was last seen
        last = seen[0]
        console.print(
            f"crawl {crawl_id} finished and its state was removed once its last worker was "
            "done (SCHEDULER_PERSIST is off): its counts as last seen while it ran "
            f"({last.elapsed:.0f} s in; items lag by up to a heartbeat), the workers' logs "
            "have each one's stats",
            highlight=False,
            soft_wrap=True,
        )
        _print_counts(
            last.counts, crawl_id, last.stats, "removed at its end (SCHEDULER_PERSIST off)"
        )
    else:
        _print_counts(c, crawl_id, frontier.stats(), _state(frontier, c, lost))
    if log_dir is not None:
        console.print(f"worker logs: {_show(log_dir)}/", highlight=False)
    # exit 5 is decided by the counts read here, the ones the message below is about
    # (not by the fleet's own last read: the two reads may disagree)
    code = 0 if result.code == EXIT_UNFINISHED else result.code
    if code == 0 and (lost or not c.finished):
        code = EXIT_UNFINISHED
    if lost:  # (its workers stopped; a plain rerun would fetch the lost sites again)
        text = partitions_lost_text(crawl_id, lost, frontier.settings.partitions)
        console.print(
            f"[bold red]error:[/] {text}",
            highlight=False,
            soft_wrap=True,
        )
    elif not c.finished:
        left = c.ready + c.delayed + c.in_flight
        why = (
            f"stopped by {signal.Signals(result.signal).name}"
            if result.signal is not None
            else "a worker failed (see above)"
            if result.failed
            else "every worker stopped before it finished (see above)"
        )
        console.print(
            f"[yellow]crawl {crawl_id} is not finished[/] ({left:,} request(s) left): {why}; "
            "run the same command again to resume it",
            highlight=False,
            soft_wrap=True,
        )
    elif result.signal is not None:
        console.print("stopped: run the same command again to resume the crawl")
    elif removed and dead:
        # (removed with the state: `redcrawl dead` has nothing left to list)
        console.print(
            f"[{'red' if fail_on_dead else 'yellow'}]{dead:,} dead letter(s)[/]"
            f"{'' if final else ' as last seen'}, "
            "removed with the crawl's state (SCHEDULER_PERSIST is off); the workers' logs "
            "name them",
            highlight=False,
            soft_wrap=True,
        )
        if code == 0 and fail_on_dead:
            code = EXIT_DEAD_LETTERS
    elif code == 0 and fail_on_dead and dead:
        console.print(f"[red]{dead:,} dead letter(s)[/]: see `redcrawl dead --crawl {crawl_id}`")
        code = EXIT_DEAD_LETTERS
    elif dead:
        _say_dead(frontier, dead, crawl_id)
    return code


def _say_dead(frontier: FrontierCore, dead: int, crawl_id: str) -> None:
    """A crawl that finished with dead letters: how many, the oldest one's error, and
    the command that lists them (the table alone said `dead 48` and nothing more)."""
    first = ""
    with contextlib.suppress(RedcrawlError):  # only a hint: the counts were read already
        rows = frontier.dead(1)
        if rows:
            error = (rows[0].error or "").strip().splitlines()[:1] or [""]
            first = escape(f" (the first: {rows[0].url}: {error[0][:200]})")
    console.print(
        f"[yellow]{dead:,} dead letter(s)[/]{first}: `redcrawl dead --crawl {crawl_id}` lists "
        "them, `--requeue` puts them back",
        highlight=False,
        soft_wrap=True,
        markup=True,
    )


@app.command()
@_guard
@_stoppable
def demo(
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, max=32)] = 4,
    products: Annotated[
        int, typer.Option(min=0, max=1_000_000, help="Product pages in the demo shop.")
    ] = 3000,
    directory: Annotated[
        Path,
        typer.Option(
            "--dir", help="Where the embedded Redis, the worker logs and the SQLite results go."
        ),
    ] = Path(".redcrawl-demo"),
    progress: Annotated[bool, typer.Option(help="Show the live progress line.")] = True,
) -> None:
    """Crawl a bundled shop site (served on loopback) with N workers on the embedded
    Redis, then report pages, items, duplicates, retries and dead letters. Each demo
    starts over; one at a time per --dir (a second one is refused, exit 2)."""
    from redcrawl.demo.run import DemoRunning, run_demo

    try:
        code = run_demo(workers=workers, products=products, directory=directory, progress=progress)
    except DemoRunning as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    raise typer.Exit(code)


@app.command()
@_guard
def serve(
    redis_url: RedisUrl = None,
    host: Annotated[
        str | None,
        typer.Option(
            help="Address to bind (REDCRAWL_API_HOST, default 127.0.0.1). Binding beyond "
            "loopback needs API tokens."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (REDCRAWL_API_PORT, default 8700).")
    ] = None,
) -> None:
    """Run the HTTP control plane: submit requests, inspect and steer crawls (/v1, OpenAPI
    schema at /openapi.json). Tokens: REDCRAWL_API_TOKENS (read) and
    REDCRAWL_API_ADMIN_TOKENS (admin)."""
    from redcrawl.api import serve as run_server
    from redcrawl.api.hosts import bind_address

    settings = _settings(redis_url, api_host=host, api_port=port)
    address = bind_address(settings.api_host)
    if problem := _unbindable(address, settings.api_port):
        raise _fail(
            f"cannot listen on {settings.api_host}:{settings.api_port}: {problem} (another "
            "`redcrawl serve`?); give another --port (REDCRAWL_API_PORT) or stop that one",
            EXIT_USAGE,
        )
    try:
        run_server(settings)
    except SystemExit as exc:  # uvicorn's startup failure (3), said in its log above
        if exc.code not in (None, 0):
            raise _fail("the API server could not start (see above)", EXIT_FAILED) from None
        raise


def _unbindable(host: str, port: int) -> str | None:
    """Why ``host:port`` can't be listened on (e.g. the port is in use), or None; bound
    as uvicorn binds it (SO_REUSEADDR) and closed at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return None  # the server says it
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


@app.command("stop-embedded")
@_guard
def stop_embedded_command(
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Stop it even while processes still use it (they lose Redis)."
        ),
    ] = False,
) -> None:
    """Stop the embedded Redis of this folder (.redcrawl/, its data kept on disk). It
    stops by itself when the last process using it exits; this is for a server left
    running after its last user was killed."""
    settings = _settings(None)
    try:
        stopped = stop_embedded(settings, force=force)
    except RedcrawlError as exc:
        if force or type(exc) is not RedcrawlError:  # (in use: a plain RedcrawlError)
            raise
        # the library's words, and the flag that forces it
        raise _fail(
            f"{exc} with `redcrawl stop-embedded --force` (they lose their Redis)", EXIT_FAILED
        ) from None
    if stopped:
        typer.echo(f"stopped the embedded Redis in {settings.embedded_dir.resolve()}")
    else:
        typer.echo(f"no embedded Redis running in {settings.embedded_dir.resolve()}")
