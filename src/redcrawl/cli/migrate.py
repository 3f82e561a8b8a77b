"""``redcrawl import-scrapy-redis SPIDER`` (move a scrapy-redis crawl, queue and dupefilter,
into a redcrawl crawl: the work is :func:`redcrawl.migrate.import_scrapy_redis`),
``redcrawl import-dupefilter KEY`` and ``redcrawl migrate --to URL`` (copy a stopped crawl
to another Redis or a Redis Cluster: :func:`redcrawl.migrate_to.copy_crawl`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

import redis
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from redcrawl.cli._common import (
    EXIT_FAILED,
    CrawlName,
    RedisUrl,
    _connect,
    _crawl,
    _existing,
    _guard,
    _settings,
    _state_exists,
    _where,
    app,
    console,
)
from redcrawl.connection import connect, redact
from redcrawl.errors import ConfigError, ConnectionError_
from redcrawl.frontier import open_frontier
from redcrawl.keys import MAX_PARTITIONS
from redcrawl.migrate import (
    DEFAULT_DUPEFILTER_KEY,
    DEFAULT_QUEUE_KEY,
    MigrationResult,
    import_scrapy_redis,
)
from redcrawl.migrate_to import BATCH, CopyResult, copy_crawl
from redcrawl.settings import QUEUE_CLASSES, Settings
from redcrawl.transport import redis_errors


@app.command("import-dupefilter")
@_guard
def import_dupefilter(
    key: Annotated[
        str, typer.Argument(help="The scrapy-redis dupefilter set, e.g. myspider:dupefilter.")
    ],
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    source_url: Annotated[
        str | None,
        typer.Option(
            "--source-url",
            envvar="REDCRAWL_SOURCE_URL",
            show_envvar=True,
            help="Redis holding the set (default: the crawl's Redis).",
        ),
    ] = None,
    batch: Annotated[
        int, typer.Option(min=1, max=100_000, help="Fingerprints per round trip.")
    ] = 10_000,
) -> None:
    """Load a scrapy-redis dupefilter (a set of hex SHA-1 fingerprints) into a crawl's
    DONE filter, so a crawl moving over from scrapy-redis does not refetch what it has.
    Streams with SSCAN (the source may be live); safe to run again after switching."""
    from redcrawl.dedupe import import_hex_set

    settings = _settings(redis_url)
    name = _crawl(settings, crawl_name, _connect(settings) if _state_exists(settings) else None)
    frontier = open_frontier(_connect(settings, create=True), settings, name, follow_layout=True)
    if settings.canonicalize:
        console.print(
            "[yellow]warning:[/] REDCRAWL_CANONICALIZE is on: this crawl's "
            "fingerprints differ from scrapy-redis's, so imported ones will not "
            "match new requests"
        )
    source = frontier.client if source_url is None else connect(settings, url=source_url)
    try:
        from redcrawl.migrate import dupefilter_import_warnings

        for warning in dupefilter_import_warnings(source, key, frontier):
            console.print(f"[yellow]warning:[/] {warning}")
        result = import_hex_set(
            source,
            key,
            frontier.done,
            batch=batch,
            progress=lambda n: console.print(f"read {n:,}", end="\r"),
        )
    finally:
        source.close()
        frontier.client.close()
    typer.echo(
        f"read {result.read:,} fingerprints from {key}: {result.added:,} added, "
        f"{result.read - result.added - result.invalid:,} already there, "
        f"{result.invalid:,} invalid"
    )
    if result.invalid:
        console.print(
            f"[yellow]skipped {result.invalid:,} member(s) that are not 40 hex "
            f"digits, e.g. {result.example!r}[/]"
        )


@app.command("import-scrapy-redis")
@_guard
def import_scrapy_redis_command(
    spider: Annotated[
        str,
        typer.Argument(
            help="The scrapy-redis spider's name (its keys are <spider>:requests and "
            "<spider>:dupefilter by default)."
        ),
    ],
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    source_url: Annotated[
        str | None,
        typer.Option(
            "--source-url",
            envvar="REDCRAWL_SOURCE_URL",
            show_envvar=True,
            help="Redis holding the scrapy-redis keys (default: the crawl's "
            "Redis, i.e. the project's REDIS_URL inside a scrapy-redis project).",
        ),
    ] = None,
    queue_key: Annotated[
        str | None,
        typer.Option(
            "--queue-key",
            help="scrapy-redis's SCHEDULER_QUEUE_KEY template (default: the "
            f"project's, else {DEFAULT_QUEUE_KEY}).",
        ),
    ] = None,
    dupefilter_key: Annotated[
        str | None,
        typer.Option(
            "--dupefilter-key",
            help="scrapy-redis's SCHEDULER_DUPEFILTER_KEY template "
            f"(default: the project's, else {DEFAULT_DUPEFILTER_KEY}).",
        ),
    ] = None,
    queue_class: Annotated[
        str | None,
        typer.Option(
            "--queue-class",
            help="scrapy-redis's SCHEDULER_QUEUE_CLASS, for a queue that is a "
            "list: FifoQueue or LifoQueue, or scrapy_redis.queue.FifoQueue ... (default: "
            "the project's, else FifoQueue; a sorted set is always a PriorityQueue, "
            "scrapy-redis's default).",
        ),
    ] = None,
    batch: Annotated[
        int, typer.Option(min=1, max=100_000, help="Requests or fingerprints per round trip.")
    ] = 1000,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read and check everything, write nothing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Import a queue that was imported into this crawl already (its "
            "dont_filter requests are queued again).",
        ),
    ] = False,
    partial: Annotated[
        bool,
        typer.Option(
            "--partial",
            help="Import although some queued requests cannot be (without it nothing is "
            "written then): those stay in the scrapy-redis queue and their pages are "
            "marked done, so redcrawl never fetches them.",
        ),
    ] = False,
) -> None:
    """Move an unfinished scrapy-redis crawl into a redcrawl crawl: its queued requests
    become ready requests, its dupefilter's other fingerprints become done, and the crawl
    keeps scrapy-redis's fingerprints so that nothing scrapy-redis fetched is fetched again.
    Stop the scrapy-redis workers first; the scrapy-redis keys are only read. Queue entries
    are unpickled once, refusing anything but plain Scrapy request dicts (never running
    code from them); when any is refused nothing is imported (exit 1) unless --partial."""
    settings = _settings(redis_url)
    name = crawl_name or settings.crawl_name(spider)
    if queue_key is None:  # SCHEDULER_QUEUE_KEY is read as the crawl name's template
        template = settings.crawl if settings.crawl and "%(" in settings.crawl else None
        queue_key = template or DEFAULT_QUEUE_KEY
    if queue_class is not None and f"scrapy_redis.queue.{queue_class.strip()}" in QUEUE_CLASSES:
        queue_class = f"scrapy_redis.queue.{queue_class.strip()}"  # a bare class name
    frontier = open_frontier(_connect(settings, create=True), settings, name, follow_layout=True)
    source = frontier.client if source_url is None else connect(settings, url=source_url)
    try:
        if queue_class is None and settings.ordering != "priority":
            # the key's type says which class wrote it: a sorted set is a PriorityQueue
            # (scrapy-redis's default: redcrawl's default ordering says nothing of it);
            # only a list needs the project's SCHEDULER_QUEUE_CLASS, fifo or lifo
            with redis_errors("reading the scrapy-redis queue"):
                kind = source.type(queue_key % {"spider": spider})
            if kind in (b"list", "list"):
                queue_class = settings.ordering
        result = import_scrapy_redis(
            source,
            frontier,
            spider,
            queue_key=queue_key,
            dupefilter_key=dupefilter_key or settings.dupefilter_key or DEFAULT_DUPEFILTER_KEY,
            queue_class=queue_class,
            batch=batch,
            dry_run=dry_run,
            force=force,
            partial=partial,
            progress=lambda stage, n: console.print(f"{stage}: read {n:,}", end="\r"),
        )
    finally:
        if source is not frontier.client:
            source.close()
        frontier.client.close()
    _report(result, name)
    if result.refused or result.unstorable:
        raise typer.Exit(EXIT_FAILED)


def _report(r: MigrationResult, crawl: str) -> None:
    verb = "would be" if r.dry_run or r.stopped else "were"
    typer.echo(f"{'dry run: ' if r.dry_run else ''}crawl {crawl} (scrapy-redis fingerprints)")
    if r.queue_type == "none":
        typer.echo(f"queue {r.queue_key}: not found (nothing was queued)")
    else:
        typer.echo(
            f"queue {r.queue_key} ({r.queue_type}, {r.queue_order}): {r.queue_read:,} "
            f"read, {r.pushed:,} {verb} queued, {r.already_known:,} already known, "
            f"{r.refused:,} refused, {r.unstorable:,} not storable"
        )
    if r.stopped:
        typer.echo(f"dupefilter {r.dupefilter_key}: not read (nothing imported)")
    else:
        typer.echo(
            f"dupefilter {r.dupefilter_key}: {r.dupefilter_read:,} read, {r.done_added:,} "
            f"{verb} marked done, {r.done_already:,} already done, {r.queued_members:,} "
            f"belong to queued requests, {r.invalid_members:,} invalid"
            + (
                f", {r.left_members:,} belong to requests not imported (not marked done)"
                if r.left_members
                else ""
            )
        )
    for example in r.examples:
        console.print(f"[yellow]  {example}[/]")
    for warning in r.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    left = r.refused + r.unstorable
    if left and r.stopped:
        console.print(f"[red]nothing imported: {left:,} queued request(s) cannot be[/] (above)")
    elif left:
        were = "would not be" if r.dry_run else "were not"
        console.print(f"[red]{left:,} queued request(s) {were} imported[/] (above)")


@app.command("migrate")
@_guard
def migrate_command(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            envvar="REDCRAWL_MIGRATE_TO",
            show_envvar=True,
            help="The Redis to copy the crawl to: redis://host:port/db, or a Redis Cluster "
            "as redis+cluster://host:port[,host:port...]. With a password, give it in the "
            "environment: the process list shows the command line.",
        ),
    ],
    redis_url: RedisUrl = None,
    crawl_name: CrawlName = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace", help="Delete a crawl of that name in the target first, then copy."
        ),
    ] = False,
    force_expire: Annotated[
        bool,
        typer.Option(
            "--force-expire",
            help="Copy although the crawl has live heartbeats or unexpired leases (workers "
            "you know are gone); their leases go back to ready in the copy.",
        ),
    ] = False,
    delete_source: Annotated[
        bool,
        typer.Option(
            "--delete-source", help="Delete the crawl from the source once the copy verified."
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check everything and list what would be copied."),
    ] = False,
    batch: Annotated[
        int, typer.Option(min=1, max=10_000, help="Keys per pipelined DUMP/RESTORE round.")
    ] = BATCH,
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            min=1,
            max=MAX_PARTITIONS,
            help="Partitions of the copy (default: the source's). Another count re-homes "
            "the crawl: each request and site moves to the partition its site hashes to; "
            "a multiple of the source's count (e.g. 1 -> 16).",
        ),
    ] = None,
) -> None:
    """Copy a stopped crawl to another Redis server or a Redis Cluster (DUMP/RESTORE in
    pipelined batches), verify its counts there, and leave the source as it was (unless
    --delete-source). A running crawl, or a target that already holds a crawl of that
    name, is refused. Leases the stopped crawl still held go back to ready in the copy.
    With --partitions P the copy is spread over P partitions (workers of the copy then
    run with REDCRAWL_PARTITIONS=P)."""
    settings = _settings(redis_url)
    source = _connect(settings)
    try:
        name = _crawl(settings, crawl_name, source)
        _existing(settings, source, name)
        target = _target(settings, to)
        try:
            result = _copy_with_progress(
                source,
                target,
                settings,
                name,
                replace=replace,
                force_expire=force_expire,
                delete_source=delete_source,
                dry_run=dry_run,
                batch=batch,
                partitions=partitions,
            )
        finally:
            target.close()
    finally:
        source.close()
    _report_copy(result, _where(settings), redact(to))


def _target(settings: Settings, url: str) -> redis.Redis:
    """A client of the ``--to`` Redis; its errors name ``--to``."""
    try:
        return connect(settings, url=url)
    except ConfigError as exc:
        said = exc.problem
        raise ConfigError("--to", said.replace("REDCRAWL_REDIS_URL / REDIS_URL", "--to")) from None
    except ConnectionError_ as exc:
        cause = re.search(r"\((.*)\)\. Check", str(exc))
        raise ConnectionError_(
            f"cannot reach the target Redis at {redact(url)} "
            f"({cause.group(1) if cause else exc}); check the --to URL and that the server "
            "runs. Nothing was copied"
        ) from None


def _copy_with_progress(*args: Any, **kwargs: Any) -> CopyResult:
    """:func:`copy_crawl` under a rich progress bar (stage, done of total, elapsed)."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("listing keys", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total or None)

        return copy_crawl(*args, progress=progress, **kwargs)


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB" if size >= 100_000 else f"{size / 1e3:,.1f} kB"


def _report_copy(r: CopyResult, source: str, target: str) -> None:
    parts = ", ".join(f"{k} {n:,}" for k, n in sorted(r.parts.items()))
    c = r.before
    if r.dry_run:
        typer.echo(f"dry run: crawl {r.crawl} from {source} to {target}")
        typer.echo(f"would {'read' if r.rehome else 'copy'} {r.keys:,} keys ({parts})")
    elif r.rehome is not None:
        typer.echo(
            f"re-homed crawl {r.crawl} from {source} to {target} in {r.seconds:.1f} s: read "
            f"{len(r.copied):,} keys of the source ({parts}); wrote "
            f"{sum(r.rehome.requests):,} requests and {r.keys:,} keys copied whole "
            f"({_mb(r.size)})"
        )
    else:
        typer.echo(
            f"copied crawl {r.crawl} from {source} to {target}: {r.keys:,} keys "
            f"({_mb(r.size)}) in {r.seconds:.1f} s ({parts})"
        )
    if c is not None:
        verified = (
            ""
            if r.dry_run
            else ", equal in the copy (verified in counts and counters)"
            if r.rehome is not None
            else ", equal in the copy (verified key by key)"
        )
        typer.echo(
            f"counts: accepted {c.accepted:,} = ready {c.ready:,} + delayed {c.delayed:,} "
            f"+ in flight {c.in_flight:,} + done {c.done:,} + dead {c.dead:,}; "
            f"duplicates filtered {c.filtered:,}{verified}"
        )
        if c.in_flight and r.dry_run:
            typer.echo(f"{c.in_flight:,} in flight would go back to ready in the copy")
    if r.after is not None and c is not None and r.after != c:
        a = r.after
        typer.echo(
            f"in the copy, {r.returned:,} in-flight request(s) went back to ready"
            + (f", {r.dead_lettered:,} to dead (attempts used up)" if r.dead_lettered else "")
            + (f", {r.promoted:,} due delayed promoted" if r.promoted else "")
            + f": ready {a.ready:,}, delayed {a.delayed:,}, in flight 0, dead {a.dead:,}"
        )
    if r.rehome is not None:
        h = r.rehome
        copies = h.partitions // h.source_partitions
        if r.dry_run:
            typer.echo(
                f"would re-home it from {h.source_partitions} into {h.partitions} "
                f"partitions, the DONE filter copied {copies}x"
            )
        else:
            spread = ", ".join(f"{n:,}" for n in h.requests)
            typer.echo(
                f"re-homed from {h.source_partitions} into {h.partitions} partitions: "
                f"requests per partition {spread}"
            )
            typer.echo(
                f"{h.sites:,} site state(s) moved to their partitions; the DONE filter "
                f"copied {copies}x ({h.filter_copies:,} keys, {_mb(h.filter_bytes)}); run "
                f"the copy's workers with REDCRAWL_PARTITIONS={h.partitions}"
            )
    if r.skipped:
        typer.echo(
            f"not copied: {len(r.skipped):,} key(s) that expire by themselves, e.g. {r.skipped[0]}"
        )
    if r.replaced:
        verb = "would be" if r.dry_run else "was"
        typer.echo(f"the target's crawl {r.crawl} ({r.replaced:,} keys) {verb} deleted first")
    if not r.dry_run:
        typer.echo(
            "the source crawl was deleted"
            if r.source_deleted
            else "the source was left as it was (--delete-source removes it after a copy)"
        )
    for warning in r.warnings:
        if not warning.startswith("the target's crawl"):
            console.print(f"[yellow]warning:[/] {warning}")
    if r.live_workers or r.held_leases:
        console.print(
            f"[yellow]warning:[/] --force-expire: {r.live_workers} live worker(s) and "
            f"{r.held_leases} leased request(s) in the source were treated as gone"
        )
