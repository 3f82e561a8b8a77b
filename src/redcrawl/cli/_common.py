"""What every ``redcrawl`` command shares: the typer app, the common options, the mapping
of redcrawl's errors to exit codes, and the rules that pick the crawl and its Redis."""

from __future__ import annotations

import errno
import functools
import os
from pathlib import Path
from typing import Annotated, Any

import redis
import typer
from redis.exceptions import RedisClusterException
from rich.console import Console
from rich.table import Table

from redcrawl.connection import EmbeddedRedis, connect, redact, resolve_url
from redcrawl.errors import ConfigError, ConnectionError_, LayoutMismatch, RedcrawlError
from redcrawl.frontier import Counts
from redcrawl.frontier.partitioned import anchor_lost, partitions_left
from redcrawl.keys import CrawlKeys, validate_crawl_name
from redcrawl.settings import Settings
from redcrawl.transport import WORKER_ADVICE, redis_errors
from redcrawl.workers import (
    ExitCode,
    UnknownSpider,
    in_scrapy_project,
    project_settings,
    project_spiders,
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

RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="REDCRAWL_REDIS_URL",
        help="Redis to use, e.g. redis://host:6379/0. Default: the embedded Redis in ./.redcrawl.",
    ),
]
CrawlName = Annotated[
    str | None,
    typer.Option(
        "--crawl",
        envvar="REDCRAWL_CRAWL",
        help="Crawl name. Default: the project's REDCRAWL_CRAWL, else its spider if it has "
        "only one, else the only crawl in the Redis.",
    ),
]

EXIT_FAILED, EXIT_USAGE, EXIT_REDIS = ExitCode.FAILED, ExitCode.USAGE, ExitCode.REDIS
EXIT_DEAD_LETTERS, EXIT_UNFINISHED = ExitCode.DEAD_LETTERS, ExitCode.UNFINISHED


def _settings(
    redis_url: str | None, *, spider: dict[str, Any] | None = None, **changes: Any
) -> Settings:
    """Project settings (if in a Scrapy project) and the ``spider``'s custom_settings above
    them, then REDCRAWL_* env, then flags."""
    base: Settings
    if in_scrapy_project():
        project = project_settings()  # a broken settings.py: an error line, exit 2
        if spider:
            project.setdict(spider, priority="spider")
        base = Settings.from_scrapy(project)
    else:
        base = Settings.from_env(base=Settings.from_mapping(spider or {}))
    if redis_url:
        changes["redis_url"] = redis_url
    return base.replace(**{k: v for k, v in changes.items() if v is not None})


def _fail(message: str, code: int) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


_FLAG_WORDS = (
    (
        "REDCRAWL_REDIS_URL / REDIS_URL point at it, or unset them",
        "--redis-url points at it, or leave it out",
    ),
    ("setting REDCRAWL_REDIS_URL:", "--redis-url:"),
    ("REDCRAWL_REDIS_URL / REDIS_URL: they name", "--redis-url: it names"),
    ("REDCRAWL_REDIS_URL / REDIS_URL", "--redis-url"),
)
"""Words of the errors about the Redis URL, and what they say instead when the URL came
from ``--redis-url`` (the messages name the settings, the variables a worker reads)."""


def _said(exc: RedcrawlError, flag: str | None) -> str:
    """The error's message, naming ``--redis-url`` if the command was given one (``flag``:
    its value; the same as REDCRAWL_REDIS_URL's when it came from the variable)."""
    text = str(exc).replace(WORKER_ADVICE, "")  # (a command holds no leases)
    if flag is None or flag == os.environ.get("REDCRAWL_REDIS_URL") or redact(flag) not in text:
        return text  # (not about that URL: e.g. `migrate --to`'s)
    for words, instead in _FLAG_WORDS:
        text = text.replace(words, instead)
    return text


_FULL = frozenset((errno.ENOSPC, errno.EROFS, errno.EDQUOT))
"""Write errors :func:`_guard` says in one line (no space left, a read-only file system, a
quota)."""


def _guard(fn: Any) -> Any:
    """Turn redcrawl's errors into messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flag = kwargs.get("redis_url")
        try:
            return fn(*args, **kwargs)
        except (ConfigError, UnknownSpider) as exc:
            raise _fail(_said(exc, flag), EXIT_USAGE) from None
        except ConnectionError_ as exc:
            raise _fail(_said(exc, flag), EXIT_REDIS) from None
        except RedcrawlError as exc:
            raise _fail(_said(exc, flag), EXIT_FAILED) from None
        except OSError as exc:
            if exc.errno not in _FULL:
                raise
            # (the output or the folder: a full disk or a read-only one, said in one line)
            where = f" ({exc.filename})" if exc.filename else " (the output)"
            raise _fail(f"cannot write{where}: {exc.strerror}", EXIT_FAILED) from None
        except (redis.exceptions.RedisError, RedisClusterException) as exc:  # (a call outside
            try:  # redis_errors: a bug) mapped as there, or said as it is
                with redis_errors(f"`redcrawl {fn.__name__.replace('_', '-')}`"):
                    raise exc
            except RedcrawlError as mapped:
                code = EXIT_REDIS if isinstance(mapped, ConnectionError_) else EXIT_FAILED
                raise _fail(_said(mapped, flag), code) from None
            except (redis.exceptions.RedisError, RedisClusterException):
                pass
            raise _fail(f"Redis failed: {type(exc).__name__}: {exc}", EXIT_FAILED) from None

    return wrapper


def _stoppable(fn: Any) -> Any:
    """For the commands that start an embedded Redis and a fleet (crawl, demo): SIGTERM or
    SIGHUP before the workers start or after they end unwinds the command (the embedded
    Redis it started is stopped: :func:`~redcrawl.workers.stop_on_signals`), said in one
    line, exit 128 + N. (While the workers run, the fleet handles them.)"""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import signal

        from redcrawl.workers import Stopped, stop_on_signals

        try:
            with stop_on_signals():
                return fn(*args, **kwargs)
        except Stopped as exc:
            console.print(
                f"stopped by {signal.Signals(exc.signum).name}; run the same command again "
                "(a crawl resumes where it stopped)",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(128 + exc.signum) from None

    return wrapper


# --- where the crawl state is ------------------------------------------------------------


def _has_data(directory: Path) -> bool:
    """Whether an embedded Redis folder holds saved data (AOF or RDB)."""
    return any(
        (directory / name).exists() for name in ("appendonlydir", "appendonly.aof", "dump.rdb")
    )


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
        raise _fail(
            f"no crawl state found at {settings.embedded_dir.resolve()} (embedded "
            "Redis not running); run from the crawl's folder or set "
            "REDCRAWL_REDIS_URL",
            EXIT_REDIS,
        )
    return connect(settings, url=resolve_url(settings))


def _where(settings: Settings) -> str:
    if settings.redis_url:
        return redact(settings.redis_url)
    return f"the embedded Redis in {settings.embedded_dir.resolve()}"


def _crawls(client: redis.Redis, prefix: str) -> list[str]:
    """Every crawl in the Redis (each one that ever accepted a request has a stats hash):
    the crawl registry, or one SCAN matching the stats keys only until the registry is
    complete (:func:`redcrawl.metrics.registry.all_crawls`)."""
    from redcrawl.metrics.registry import all_crawls

    with redis_errors("listing the crawls"):
        names = all_crawls(client, prefix)
    return [n for n, ok in zip(names, _alive(client, prefix, names), strict=True) if ok]


def _alive(client: redis.Redis, prefix: str, names: list[str]) -> list[bool]:
    """Whether each crawl exists, as the API decides it
    (:func:`redcrawl.metrics.registry.alive`)."""
    from redcrawl.metrics.registry import alive

    with redis_errors("listing crawls"):
        return alive(client, prefix, names)


def _crawl(settings: Settings, given: str | None, client: redis.Redis | None) -> str:
    """The crawl a command works on: ``--crawl``/``REDCRAWL_CRAWL``, else the project's
    setting, else the project's only spider, else the only crawl in the Redis (of this
    project's spiders, in a project)."""
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
    ours = [c for c in crawls if c in {settings.crawl_name(s) for s in spiders}]
    if len(ours) == 1:  # the only crawl of this project's spiders
        return ours[0]
    known = f"this project's spiders: {', '.join(spiders)}; " if spiders else ""
    here = (
        f"crawls in {_where(settings)}: {', '.join(crawls)}"
        if crawls
        else f"{_where(settings)} holds no crawl"
    )
    raise _fail(
        f"which crawl? Give --crawl NAME (or set REDCRAWL_CRAWL); {known}{here}", EXIT_USAGE
    )


def _existing(settings: Settings, client: redis.Redis, name: str) -> None:
    """Refuse a crawl that does not exist, as the API decides it (404): never made, or
    purged (a purge keeps its id counters, :func:`_alive`): exit 1."""
    if not _alive(client, settings.key_prefix, [name])[0]:
        left = partitions_left(client, CrawlKeys(name, prefix=settings.key_prefix))
        if left:  # a partitioned crawl whose anchor's master came back empty
            raise _lost_anchor(name, left)
        crawls = _crawls(client, settings.key_prefix)
        listed = f"crawls there: {', '.join(crawls)}" if crawls else "it holds no crawl"
        raise _fail(
            f"no crawl named {name!r} in {_where(settings)}{_removed(settings, client, name)}; "
            f"{listed}",
            EXIT_FAILED,
        )


def _lost_anchor(name: str, left: list[int]) -> typer.Exit:
    """The error (exit 1) for a partitioned crawl whose anchor is gone while partitions
    ``left`` remain (:func:`~redcrawl.frontier.partitioned.anchor_lost`)."""
    return _fail(
        str(anchor_lost(name, left)).removeprefix(f"{LayoutMismatch.PREFIX}: "), EXIT_FAILED
    )


def _removed(settings: Settings, client: redis.Redis, name: str) -> str:
    """', it finished and ... removed ...' with the counts its last worker left, for a
    crawl removed at its end (SCHEDULER_PERSIST off: frontier/final.py), else ''."""
    from redcrawl.frontier.final import read_final

    try:
        final = read_final(client, CrawlKeys(name, prefix=settings.key_prefix))
    except (redis.RedisError, RedcrawlError):
        return ""  # (only a hint)
    if final is None:
        return ""
    c, stats = final
    return (
        ": it finished and its state was removed at its end (SCHEDULER_PERSIST is off), "
        f"leaving its counts: {c.accepted:,} accepted, {c.done:,} done, {c.dead:,} dead, "
        f"{stats.get('items', 0):,} items (kept a day after it finished)"
    )


def _state(frontier: Any, c: Counts, lost: list[int] | None = None) -> str:
    """finished / running / paused / stopped, with the number of live workers; damaged
    first, when partitions lost their state (``lost``: read here when not given)."""
    lost = frontier.lost_partitions() if lost is None else lost
    if lost:
        return f"damaged: partition{'s' * (len(lost) > 1)} {', '.join(map(str, lost))} lost"
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
    for label, value in (
        ("accepted", f"{c.accepted:,}"),
        ("duplicates filtered", dupes),
        ("ready", f"{c.ready:,}"),
        ("delayed (retry)", f"{c.delayed:,}"),
        ("in flight", f"{c.in_flight:,}"),
        ("done", f"{c.done:,}"),
        ("dead", f"{c.dead:,}"),
        ("items", f"{stats.get('items', 0):,}"),
        ("retries", f"{c.retried:,}"),
        ("reclaimed leases", f"{c.reclaimed:,}"),
        ("robots.txt disallowed", f"{stats.get('robots_disallowed', 0):,} (done, not fetched)"),
        ("orphaned leases", f"{stats.get('orphaned', 0):,} (taken back after a failover)"),
        ("state", state),
    ):
        if label == "robots.txt disallowed" and not stats.get("robots_disallowed"):
            continue
        if label == "orphaned leases" and not stats.get("orphaned"):
            continue
        table.add_row(label, value)
    Console().print(table)
