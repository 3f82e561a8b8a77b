"""``redcrawl import-scrapy-redis SPIDER`` (move a scrapy-redis crawl, queue and dupefilter,
into a redcrawl crawl: the work is :func:`redcrawl.migrate.import_scrapy_redis`) and
``redcrawl import-dupefilter KEY``."""

from __future__ import annotations

from typing import Annotated

import typer

from redcrawl.cli._common import (
    EXIT_FAILED,
    CrawlName,
    RedisUrl,
    _connect,
    _crawl,
    _guard,
    _settings,
    _state_exists,
    app,
    console,
)
from redcrawl.connection import connect
from redcrawl.frontier import open_frontier
from redcrawl.migrate import (
    DEFAULT_DUPEFILTER_KEY,
    DEFAULT_QUEUE_KEY,
    MigrationResult,
    import_scrapy_redis,
)


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
        typer.Option("--source-url", help="Redis holding the set (default: the crawl's Redis)."),
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
            "list: FifoQueue or LifoQueue (default: the project's; a sorted set is always a "
            "PriorityQueue).",
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
) -> None:
    """Move an unfinished scrapy-redis crawl into a redcrawl crawl: its queued requests
    become ready requests, its dupefilter's other fingerprints become done, and the crawl
    keeps scrapy-redis's fingerprints so that nothing scrapy-redis fetched is fetched again.
    Stop the scrapy-redis workers first; the scrapy-redis keys are only read. Queue entries
    are unpickled once, refusing anything but plain Scrapy request dicts (never running
    code from them)."""
    settings = _settings(redis_url)
    name = crawl_name or settings.crawl_name(spider)
    if queue_key is None:  # SCHEDULER_QUEUE_KEY is read as the crawl name's template
        template = settings.crawl if settings.crawl and "%(" in settings.crawl else None
        queue_key = template or DEFAULT_QUEUE_KEY
    frontier = open_frontier(_connect(settings, create=True), settings, name, follow_layout=True)
    if queue_class is None and settings.ordering != "priority":
        queue_class = settings.ordering  # the project's SCHEDULER_QUEUE_CLASS for lists
    source = frontier.client if source_url is None else connect(settings, url=source_url)
    try:
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
    verb = "would be" if r.dry_run else "were"
    typer.echo(f"{'dry run: ' if r.dry_run else ''}crawl {crawl} (scrapy-redis fingerprints)")
    if r.queue_type == "none":
        typer.echo(f"queue {r.queue_key}: not found (nothing was queued)")
    else:
        typer.echo(
            f"queue {r.queue_key} ({r.queue_type}, {r.queue_order}): {r.queue_read:,} "
            f"read, {r.pushed:,} {verb} queued, {r.already_known:,} already known, "
            f"{r.refused:,} refused, {r.unstorable:,} not storable"
        )
    typer.echo(
        f"dupefilter {r.dupefilter_key}: {r.dupefilter_read:,} read, {r.done_added:,} "
        f"{verb} marked done, {r.done_already:,} already done, {r.queued_members:,} "
        f"belong to queued requests, {r.invalid_members:,} invalid"
    )
    for example in r.examples:
        console.print(f"[yellow]  {example}[/]")
    for warning in r.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    if r.refused or r.unstorable:
        console.print(
            f"[red]{r.refused + r.unstorable:,} queued request(s) could not be "
            "imported[/] (see above; they stay in the scrapy-redis queue); the rest "
            f"{verb} imported"
        )
