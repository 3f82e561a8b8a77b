# Over 450 lines on purpose: one job (moving a scrapy-redis crawl in); the only module to unpickle.
"""Move a crawl from scrapy-redis 0.9.1 to redcrawl: its request queue and its dupefilter.

A scrapy-redis crawl lives in two keys (by default ``<spider>:requests`` and
``<spider>:dupefilter``):

* the **queue**: pickled ``Request.to_dict()`` dicts, in a sorted set scored by
  ``-priority`` (``PriorityQueue``, the default) or a list (``FifoQueue``: LPUSH, RPOP;
  ``LifoQueue``: LPUSH, LPOP);
* the **dupefilter**: a set of 40-digit hex SHA-1 fingerprints of every request ever
  *enqueued* (not ``dont_filter``), fetched or still queued. scrapy-redis fingerprints
  ``{"body", "method", "url"}`` (no ``"headers"`` member), so its fingerprints never equal
  Scrapy's default ones.

:func:`import_scrapy_redis` moves both into a redcrawl crawl:

1. The crawl is put in **scrapy-redis fingerprint mode** (recorded with the crawl, see
   :func:`redcrawl.fingerprint.crawl_fingerprint_mode`): a fingerprint is a hash and
   cannot be converted, and a member of the dupefilter that is not in the queue is a done
   request whose URL is not known any more. So the crawl keeps computing fingerprints the
   scrapy-redis way, and every new request matches the imported members. A crawl that
   already holds requests under Scrapy's fingerprints is refused.
2. The **queue** is read once, each entry unpickled by :class:`RequestUnpickler`, which
   refuses every global (a scrapy-redis request dict needs none: it is built of dicts,
   lists, tuples, str, bytes, int, float, bool and None only; measured by pickling
   ``Request``, ``FormRequest`` and ``JsonRequest`` dicts with scrapy-redis's own
   ``picklecompat``) but one: lxml's string, which a ``CrawlSpider``'s requests carry in
   ``meta["link_text"]``, is read as a plain ``str``. Anything else that needs a class or
   a function (an object in meta, a forged ``__reduce__``) is refused before it is built:
   counted and reported, never run. When any entry is refused (or cannot be stored),
   nothing is written unless ``partial=True``: the queue is read once first, because such
   an entry's page is in the dupefilter and step 3 would mark it done, never fetched.
   Accepted entries become envelopes (callbacks stay method names, checked against the
   spider when a worker rebuilds the request) and are **pushed as READY**, in the order
   scrapy-redis would have popped them, with their priority.
3. The **dupefilter** members that do not belong to a queued request are added to the
   crawl's DONE filter: those requests were fetched (or popped by a worker that died: a
   scrapy-redis worker's popped requests are lost with it, and nothing can tell them
   apart). With ``partial=True``, the members of requests that were read but not
   imported are left out too (their pages stay fetchable); an entry refused unread has
   no known fingerprint, and its member is marked done.

The source is only read (run it with the scrapy-redis workers stopped: the queue is read
in pages, and a queue that changes meanwhile is reported). The import holds the crawl's
``migrate`` lock and records what it did in the crawl's control hash; a second import of
the same queue is refused unless ``force=True`` (requests without a fingerprint, the
``dont_filter`` ones, would be queued twice).
"""

from __future__ import annotations

import io
import json
import pickle
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from redcrawl import codec
from redcrawl.envelope import MAX_ENVELOPE_BYTES
from redcrawl.errors import ConfigError, DecodeError, EncodeError
from redcrawl.fingerprint import MODE_FIELD, Fingerprinter, crawl_fingerprint_mode
from redcrawl.frontier import FrontierCore
from redcrawl.lock import CrawlLock
from redcrawl.settings import QUEUE_CLASSES, Ordering
from redcrawl.transport import redis_errors

__all__ = [
    "DEFAULT_DUPEFILTER_KEY",
    "DEFAULT_QUEUE_KEY",
    "MIGRATED_FIELD",
    "MigrationResult",
    "RefusedEntry",
    "RequestUnpickler",
    "dupefilter_import_warnings",
    "import_scrapy_redis",
    "request_dict_to_envelope",
    "unpickle_request_dict",
]

DEFAULT_QUEUE_KEY = "%(spider)s:requests"
"""scrapy-redis's ``SCHEDULER_QUEUE_KEY`` default."""
DEFAULT_DUPEFILTER_KEY = "%(spider)s:dupefilter"
"""scrapy-redis's ``SCHEDULER_DUPEFILTER_KEY`` default."""
MIGRATED_FIELD = "migrated-from"
"""Field of the crawl's control hash: JSON of the imports done into it, by queue key."""

_REQUEST_KEYS = frozenset(
    (
        "url",
        "callback",
        "errback",
        "headers",
        "body",
        "cookies",
        "meta",
        "encoding",
        "flags",
        "cb_kwargs",
        "dont_filter",
        "method",
        "priority",
        "_class",
    )
)
EXAMPLES = 5
"""Refused or unstorable entries described in the result."""
LOCK_TTL = 60.0


class RefusedEntry(ValueError):
    """A queue entry that is not a Scrapy request dict (or could not be read as one)."""


class _PlainStr:
    """The stand-in for a str subclass an entry names: ``_PlainStr(s)`` (pickle's
    ``NEWOBJ``/``REDUCE``) is ``s`` itself, a plain ``str``; nothing else is accepted.
    Never instantiated (``__new__`` returns the string), nothing imported."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # returns the str, not a _PlainStr
        if kwargs or len(args) != 1 or type(args[0]) is not str:
            raise pickle.UnpicklingError(
                "refused: a str subclass built from something other than one string"
            )
        return args[0]


def _reconstructor(cls: Any, base: Any, state: Any) -> str:
    """The stand-in for ``copyreg._reconstructor`` (protocols 0 and 1), for the one shape
    of a str subclass: ``_reconstructor(<a str stand-in>, str, "text")`` is ``"text"``."""
    if cls is not _PlainStr or base is not _PlainStr or type(state) is not str:
        raise pickle.UnpicklingError(
            "refused: copyreg._reconstructor other than of a str subclass from a string"
        )
    return state


class RequestUnpickler(pickle.Unpickler):
    """An unpickler for scrapy-redis queue entries that builds plain data only.

    ``find_class`` refuses every global but the few in :attr:`STAND_INS`, which it maps to
    stand-ins of its own (never importing or calling what the entry names), so a pickle
    can neither name a class nor call a function (``REDUCE``, ``NEWOBJ``, ``INST``,
    ``OBJ`` and the extension registry all get their callable through it); persistent ids
    are refused too. Containers and scalars are built by pickle's own opcodes, which is
    all a ``Request.to_dict()`` needs."""

    STAND_INS: dict[tuple[str, str], Any] = {
        # a CrawlSpider's meta["link_text"]: lxml's "smart string" (a str subclass, a
        # C type). Pickled (protocol 2..5, measured with lxml 4.9 and 6.1; 0 and 1
        # cannot pickle it) as NEWOBJ(lxml.etree._ElementUnicodeResult, ("text",)),
        # without state; read as the plain str "text" (its getparent() is lost: it
        # pointed to no element once pickled)
        ("lxml.etree", "_ElementUnicodeResult"): _PlainStr,
        # a str subclass pickled with protocol 0 or 1: _reconstructor(cls, str, "text");
        # cls must be a stand-in above (another class's name does not say it is a str)
        ("copyreg", "_reconstructor"): _reconstructor,
        ("copy_reg", "_reconstructor"): _reconstructor,  # protocols 0..2 say copy_reg
        ("builtins", "str"): _PlainStr,
        ("__builtin__", "str"): _PlainStr,
    }
    """Globals an entry may name, each mapped to a stand-in that builds a plain value:
    what a stand-in returns is always of a builtin type. Nothing else: scrapy-redis's
    pickles of Scrapy's request dicts name no other global. Value types whose
    constructors have no side effect (``datetime``, ``decimal.Decimal``) could be added
    once the codec stores them; objects never."""

    def find_class(self, module: str, name: str) -> Any:
        stand_in = self.STAND_INS.get((module, name))
        if stand_in is not None:
            return stand_in
        raise pickle.UnpicklingError(
            f"refused: the entry needs {module}.{name}; a Scrapy request dict needs no "
            "class or function"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused: the entry uses a persistent id")


def unpickle_request_dict(data: bytes) -> dict[str, Any]:
    """The request dict pickled in ``data``; :class:`RefusedEntry` for anything else."""
    try:
        obj = RequestUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # UnpicklingError, EOFError, RecursionError, ...
        reason = (
            str(exc)
            if str(exc).startswith("refused")
            else (f"not a readable pickle ({type(exc).__name__}: {exc})")
        )
        raise RefusedEntry(reason) from None
    if not isinstance(obj, dict):
        raise RefusedEntry(f"refused: a pickled {type(obj).__name__}, not a request dict")
    _within_limit(obj)
    if not isinstance(obj.get("url"), str) or not obj["url"]:
        raise RefusedEntry("refused: the dict has no 'url' string")
    if not all(isinstance(k, str) for k in obj):
        raise RefusedEntry("refused: the dict has non-string keys")
    return obj


def _within_limit(obj: Any) -> None:
    """:class:`RefusedEntry` if ``obj`` written out (as the envelope's encoding writes
    every reference to a shared list or dict again) is over the request size limit: a
    pickle's memo lets 300 bytes name one list twice, 40 levels deep (2^40 leaves)."""
    budget = MAX_ENVELOPE_BYTES
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes | bytearray):
            budget -= len(item) + 1
        elif isinstance(item, dict):
            budget -= 1 + len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            budget -= 1 + len(item)
            stack.extend(item)
        else:
            budget -= 8
        if budget < 0:
            raise RefusedEntry(
                f"refused: larger than the {MAX_ENVELOPE_BYTES}-byte request limit once its "
                "shared parts are written out"
            )


def _typed(d: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = d.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RefusedEntry(f"refused: {key!r} is a {type(value).__name__}")
    return value


def request_dict_to_envelope(d: dict[str, Any]) -> codec.Envelope:
    """A scrapy-redis request dict (``Request.to_dict()``) as an envelope (no
    fingerprint yet). :class:`RefusedEntry` if a field has the wrong type."""
    headers: list[tuple[bytes, list[bytes]]] = []
    for name, values in _typed(d, "headers", dict, {}).items():
        if isinstance(values, bytes | str):
            values = [values]
        if (
            not isinstance(name, bytes | str)
            or not isinstance(values, list | tuple)
            or not all(isinstance(v, bytes | str) for v in values)
        ):
            raise RefusedEntry("refused: malformed headers")
        headers.append((_as_bytes(name), [_as_bytes(v) for v in values]))
    request_class = _typed(d, "_class", str, None)
    extra = {k: v for k, v in d.items() if k not in _REQUEST_KEYS}
    if extra and request_class is None:
        raise RefusedEntry(f"refused: unknown request fields {sorted(extra)}")
    body = _typed(d, "body", (bytes, str), b"")
    return codec.Envelope(
        url=d["url"],
        method=_typed(d, "method", str, "GET"),
        headers=headers,
        body=_as_bytes(body),
        cookies=d.get("cookies") or None,
        meta=dict(_typed(d, "meta", dict, {})),
        callback=_typed(d, "callback", str, None),
        errback=_typed(d, "errback", str, None),
        priority=_typed(d, "priority", int, 0),
        flags=list(_typed(d, "flags", list, [])),
        dont_filter=bool(_typed(d, "dont_filter", bool, False)),
        cb_kwargs=dict(_typed(d, "cb_kwargs", dict, {})),
        encoding=_typed(d, "encoding", str, "utf-8"),
        request_class=request_class if request_class != "scrapy.http.request.Request" else None,
        extra=extra,
    )


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


@dataclass
class MigrationResult:
    """What :func:`import_scrapy_redis` read and did."""

    queue_key: str
    dupefilter_key: str
    queue_type: str = "none"
    """``zset`` (PriorityQueue), ``list`` (FifoQueue/LifoQueue) or ``none`` (no queue)."""
    queue_order: str = ""
    queue_read: int = 0
    pushed: int = 0
    """Queued requests accepted as READY."""
    already_known: int = 0
    """Queued requests the crawl already had (queued or done): not pushed again."""
    refused: int = 0
    """Entries that are not Scrapy request dicts (never built, never run)."""
    unstorable: int = 0
    """Request dicts redcrawl cannot store (e.g. meta holding objects)."""
    examples: list[str] = field(default_factory=list)
    """Why some entries were refused or unstorable (up to EXAMPLES)."""
    dupefilter_read: int = 0
    done_added: int = 0
    """Fingerprints of requests scrapy-redis took from its queue, now DONE here."""
    done_already: int = 0
    """... of which were DONE here already (a repeated import)."""
    queued_members: int = 0
    """Dupefilter members of queued requests (pushed, so not marked done)."""
    left_members: int = 0
    """Dupefilter members of queued requests that were read but not imported (refused
    or unstorable, with ``partial``): not marked done either, so their pages are
    fetched when a crawl finds them again."""
    invalid_members: int = 0
    """Dupefilter members that are not 40 hex digits (skipped)."""
    source_changed: bool = False
    """The queue's length changed while it was read: scrapy-redis workers were running."""
    dry_run: bool = False
    stopped: bool = False
    """Nothing was written: entries were refused or unstorable, and ``partial`` was not
    given (the queue was read, the dupefilter was not)."""
    partial: bool = False
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _queue_order(source: Any, key: str, queue_class: str | None) -> tuple[str, Ordering]:
    kind = source.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    wanted = None
    if queue_class is not None:
        wanted = QUEUE_CLASSES.get(queue_class.strip())
        if wanted is None:
            raise ConfigError(
                "SCHEDULER_QUEUE_CLASS",
                f"{queue_class!r} is not a scrapy-redis "
                f"queue class; use one of {', '.join(QUEUE_CLASSES)}",
            )
    if kind == "zset":
        if wanted not in (None, "priority"):
            raise ConfigError(
                "SCHEDULER_QUEUE_CLASS",
                f"{key!r} is a sorted set, written by PriorityQueue, not a {wanted} queue",
            )
        return kind, "priority"
    if kind == "list":
        if wanted == "priority":
            raise ConfigError(
                "SCHEDULER_QUEUE_CLASS",
                f"{key!r} is a list, written by "
                "FifoQueue or LifoQueue; name which one (the list alone does "
                "not say)",
            )
        return kind, wanted or "fifo"
    if kind == "none":
        return kind, wanted or "priority"
    raise ConfigError(
        "--queue-key", f"{key!r} is a {kind}, not a scrapy-redis queue (a sorted set or a list)"
    )


def _entries(
    source: Any, key: str, kind: str, order: Ordering, reverse: bool, page: int
) -> Iterator[tuple[int, bytes]]:
    """The queue's entries in the order scrapy-redis pops them (or the reverse), read in
    pages: ``(position, data)``. ZRANGE ascending is the PriorityQueue's pop order,
    LRANGE from the right end the FifoQueue's, from the left the LifoQueue's."""
    size = int(source.zcard(key) if kind == "zset" else source.llen(key))
    # pop order by index: ascending for zset and LIFO lists, descending for FIFO lists
    ascending = (order != "fifo") != reverse
    read = source.zrange if kind == "zset" else source.lrange
    for start in range(0, size, page):
        stop = min(size, start + page) - 1
        if ascending:
            chunk = list(read(key, start, stop))
            indexes = range(start, stop + 1)
        else:
            chunk = list(read(key, size - 1 - stop, size - 1 - start))[::-1]
            indexes = range(size - 1 - start, size - 2 - stop, -1)
        yield from zip(indexes, chunk, strict=False)


def _read_migrations(frontier: FrontierCore) -> dict[str, Any]:
    with redis_errors("reading the crawl's migrations"):
        raw = frontier.client.hget(frontier.keys.control, MIGRATED_FIELD)
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        data = {}
    return data if isinstance(data, dict) else {}


def import_scrapy_redis(
    source: Any,
    frontier: FrontierCore,
    spider: str,
    *,
    queue_key: str = DEFAULT_QUEUE_KEY,
    dupefilter_key: str = DEFAULT_DUPEFILTER_KEY,
    queue_class: str | None = None,
    batch: int = 1000,
    dry_run: bool = False,
    force: bool = False,
    partial: bool = False,
    progress: Callable[[str, int], None] | None = None,
) -> MigrationResult:
    """Move scrapy-redis's queue and dupefilter of ``spider`` from ``source`` (a redis-py
    client; it may be another server than the frontier's) into ``frontier``'s crawl.

    ``queue_key`` and ``dupefilter_key`` are scrapy-redis's templates (``%(spider)s`` is
    replaced). ``queue_class`` names the scrapy-redis queue class when the queue is a list
    (FifoQueue, the default, or LifoQueue); a sorted set is a PriorityQueue. With
    ``dry_run`` everything is read and checked but nothing is written. Without
    ``partial``, the queue is read once first and nothing is written (``stopped``) when
    any entry is refused or unstorable: a queued request's fingerprint is in the
    dupefilter, and a member that belongs to no imported request is marked DONE, so a
    request left behind would never be fetched. ``partial=True`` imports the rest anyway,
    that loss accepted (the warnings say it). ``progress`` is
    called as ``progress(stage, count)``. See the module docstring for what is done.

    Raises :class:`~redcrawl.errors.ConfigError` when the crawl cannot take scrapy-redis
    fingerprints (it already holds Scrapy-fingerprinted requests, or canonicalisation is
    on), when the keys are of the wrong type, or when this queue was imported already.
    """
    qkey = queue_key % {"spider": spider}
    dkey = dupefilter_key % {"spider": spider}
    result = MigrationResult(queue_key=qkey, dupefilter_key=dkey, dry_run=dry_run, partial=partial)
    if frontier.settings.canonicalize:
        raise ConfigError(
            "REDCRAWL_CANONICALIZE",
            "a migrated crawl computes fingerprints "
            "as scrapy-redis does; turn canonicalisation off for it",
        )
    with redis_errors("reading the scrapy-redis keys"):
        kind, order = _queue_order(source, qkey, queue_class)
        dkind = source.type(dkey)
    dkind = dkind.decode() if isinstance(dkind, bytes) else str(dkind)
    if dkind not in ("set", "none"):
        raise ConfigError(
            "--dupefilter-key",
            f"{dkey!r} is a {dkind}, not the set of hex fingerprints a scrapy-redis dupefilter is",
        )
    if kind == "none" and dkind == "none":
        raise ConfigError(
            "SPIDER",
            f"neither {qkey!r} nor {dkey!r} exists on the source "
            "Redis: check the spider name, --source-url and the key templates "
            "(SCHEDULER_QUEUE_KEY, SCHEDULER_DUPEFILTER_KEY)",
            kind="argument",
        )
    result.queue_type, result.queue_order = kind, order
    target = frontier.settings.ordering
    if kind != "none" and order == "priority" and target != "priority":  # (a queue there)
        result.warnings.append(
            f"the scrapy-redis queue is a PriorityQueue (strict priority) and the crawl's "
            f"ordering is {target}: priorities are kept but map to tiers (set "
            "SCHEDULER_QUEUE_CLASS or REDCRAWL_ORDERING to priority for strict order)"
        )
    previous = _read_migrations(frontier)
    if qkey in previous and not force and not dry_run:
        raise ConfigError(
            "--force",
            f"{qkey!r} was imported into crawl "
            f"{frontier.crawl!r} already ({previous[qkey]}); importing it "
            "again would queue its dont_filter requests twice. Use --force "
            "to import it anyway",
        )
    if dry_run:
        with redis_errors("reading the crawl's fingerprint mode"):
            mode = frontier.client.hget(frontier.keys.control, MODE_FIELD)
        if mode not in (None, b"scrapy-redis"):
            result.warnings.append(
                f"crawl {frontier.crawl!r} uses {mode.decode()!r} "
                "fingerprints: the import would be refused"
            )
    fingerprinter = Fingerprinter(mode="scrapy-redis")
    lock = CrawlLock(frontier.client, frontier.keys, "migrate", ttl=LOCK_TTL)
    if not dry_run and not partial and kind != "none":
        check = _check_queue(source, frontier, result, fingerprinter, kind, order, batch, progress)
        if check is not None:
            return check
    if not dry_run:
        crawl_fingerprint_mode(frontier.client, frontier.keys, "scrapy-redis")
    if not dry_run and not lock.acquire(wait=0):
        raise ConfigError(
            "--crawl",
            f"another import into crawl {frontier.crawl!r} is "
            f"running (lock {lock.key}); wait for it, or delete the key if it "
            "crashed",
        )
    try:
        queued, left = _import_queue(
            source,
            frontier,
            result,
            fingerprinter,
            kind,
            order,
            reverse=target == "lifo",
            batch=batch,
            dry_run=dry_run,
            lock=lock,
            progress=progress,
        )
        if dkind == "set":
            _import_dupefilter(
                source,
                frontier,
                result,
                queued,
                left,
                batch=batch,
                dry_run=dry_run,
                lock=lock,
                progress=progress,
            )
        if not dry_run:
            previous[qkey] = {
                "at": int(time.time()),
                "read": result.queue_read,
                "pushed": result.pushed,
                "done": result.done_added,
            }
            with redis_errors("recording the migration"):
                frontier.client.hset(
                    frontier.keys.control, MIGRATED_FIELD, json.dumps(previous, sort_keys=True)
                )
    finally:
        if lock.acquired:
            lock.release()
    _say_loss(result)
    return result


def _say_loss(result: MigrationResult) -> None:
    """Warn of queued requests a dry run or a partial import leaves behind."""
    left = result.refused + result.unstorable
    if left and result.dry_run and not result.partial:
        result.warnings.append(
            f"{left:,} queued request(s) cannot be imported: the import will write nothing "
            "(their pages are in the dupefilter and would be marked done, never fetched) "
            "unless --partial (partial=True) accepts that loss"
        )
    elif left:
        were = "would be" if result.dry_run else "were"
        result.warnings.append(
            f"--partial: {left:,} queued request(s) {were} not imported and stay in the "
            "scrapy-redis queue: let scrapy-redis workers fetch them. Of their pages, "
            f"{result.left_members:,} {were} kept out of the done import (fetched if the "
            "crawl finds them again); the others, unreadable, are marked done when the "
            "dupefilter holds them, and redcrawl will not fetch them"
        )


def _check_queue(
    source: Any,
    frontier: FrontierCore,
    result: MigrationResult,
    fingerprinter: Fingerprinter,
    kind: str,
    order: Ordering,
    batch: int,
    progress: Callable[[str, int], None] | None,
) -> MigrationResult | None:
    """Read the whole queue, writing nothing; the result to return (``stopped``) when an
    entry cannot be imported, else None (the import may go on)."""
    check = replace(result, warnings=list(result.warnings), dry_run=True)
    _import_queue(
        source,
        frontier,
        check,
        fingerprinter,
        kind,
        order,
        reverse=frontier.settings.ordering == "lifo",
        batch=batch,
        dry_run=True,
        lock=CrawlLock(frontier.client, frontier.keys, "migrate", ttl=LOCK_TTL),
        progress=progress,
    )
    left = check.refused + check.unstorable
    if not left:
        return None
    check.dry_run, check.stopped = False, True
    check.warnings.append(
        f"nothing was imported: {left:,} queued request(s) cannot be (see above). Their "
        "pages are in the scrapy-redis dupefilter, so importing the rest would mark them "
        "done here and redcrawl would never fetch them. Let the scrapy-redis workers "
        "finish those (or remove them from the queue), or import the rest anyway with "
        "--partial (partial=True), which says what it loses"
    )
    return check


def _note(result: MigrationResult, position: int, reason: str) -> None:
    if len(result.examples) < EXAMPLES:
        result.examples.append(f"entry {position}: {reason}")


def _import_queue(
    source: Any,
    frontier: FrontierCore,
    result: MigrationResult,
    fingerprinter: Fingerprinter,
    kind: str,
    order: Ordering,
    *,
    reverse: bool,
    batch: int,
    dry_run: bool,
    lock: CrawlLock,
    progress: Callable[[str, int], None] | None,
) -> tuple[set[bytes], set[bytes]]:
    """Push the queue's requests; returns their fingerprints, and those of the requests
    read but not imported (refused or unstorable; an entry refused before it was read
    has none)."""
    fingerprints: set[bytes] = set()
    left: set[bytes] = set()
    if kind == "none":
        return fingerprints, left
    pending: list[codec.Envelope] = []

    def flush() -> None:
        if not dry_run and pending:
            pushed = frontier.push(pending)
            result.pushed += pushed.accepted
            result.already_known += pushed.filtered
            lock.renew()
        elif dry_run:
            result.pushed += len(pending)
        pending.clear()

    with redis_errors("reading the scrapy-redis queue"):
        size_before = int(
            source.zcard(result.queue_key) if kind == "zset" else source.llen(result.queue_key)
        )
        for position, data in _entries(source, result.queue_key, kind, order, reverse, batch):
            result.queue_read += 1
            d: dict[str, Any] | None = None
            try:
                d = unpickle_request_dict(bytes(data))
                env = request_dict_to_envelope(d)
                # rebuilt as the worker will (class allowed, URL valid), fingerprinted
                # as scrapy-redis did it: equal to its dupefilter member
                request = codec.to_request(codec.decode(codec.encode(env)))
                if not env.dont_filter:
                    env.fingerprint = fingerprinter.request(request)
                codec.encode(env)
            except RefusedEntry as exc:
                result.refused += 1
                _note(result, position, str(exc))
                _leave(left, d, fingerprinter)
                continue
            except (EncodeError, DecodeError) as exc:
                result.unstorable += 1
                _note(result, position, f"cannot be stored: {exc}")
                _leave(left, d, fingerprinter)
                continue
            if env.fingerprint is not None:
                fingerprints.add(env.fingerprint)
            pending.append(env)
            if len(pending) >= batch:
                flush()
                if progress is not None:
                    progress("queue", result.queue_read)
        flush()
        size_after = int(
            source.zcard(result.queue_key) if kind == "zset" else source.llen(result.queue_key)
        )
    if size_after != size_before or size_after != result.queue_read:
        result.source_changed = True
        result.warnings.append(
            f"the queue changed while it was read ({size_before} -> {size_after} entries): "
            "stop every scrapy-redis worker, then run the import again with --force"
        )
    return fingerprints, left


def _leave(left: set[bytes], d: dict[str, Any] | None, fingerprinter: Fingerprinter) -> None:
    """Add to ``left`` the scrapy-redis fingerprint of the request dict ``d`` (read, but
    not imported), when it has one: its dupefilter member is then not marked done."""
    if d is None or d.get("dont_filter") is True:
        return
    from scrapy import Request

    method, body = d.get("method"), d.get("body")
    try:
        request = Request(
            d["url"],
            method=method if isinstance(method, str) else "GET",
            body=body if isinstance(body, bytes | str) else b"",
        )
        left.add(fingerprinter.request(request))
    except Exception:  # a URL Scrapy refuses: no fingerprint to keep out
        return


def _import_dupefilter(
    source: Any,
    frontier: FrontierCore,
    result: MigrationResult,
    queued: set[bytes],
    left: set[bytes],
    *,
    batch: int,
    dry_run: bool,
    lock: CrawlLock,
    progress: Callable[[str, int], None] | None,
) -> None:
    """Mark the dupefilter's members DONE, except the queued requests' own."""
    pending: list[bytes] = []

    def flush() -> None:
        if not dry_run and pending:
            added = sum(frontier.done.add(pending))
            result.done_added += added
            result.done_already += len(pending) - added
            lock.renew()
        elif dry_run:
            result.done_added += len(pending)
        pending.clear()

    with redis_errors("reading the scrapy-redis dupefilter"):
        for member in source.sscan_iter(result.dupefilter_key, count=batch):
            result.dupefilter_read += 1
            text = member.decode("ascii", "replace") if isinstance(member, bytes) else str(member)
            try:
                if len(text) != 40:
                    raise ValueError(text)
                fp = bytes.fromhex(text)
            except ValueError:
                result.invalid_members += 1
                if len(result.examples) < EXAMPLES:
                    result.examples.append(f"dupefilter member {text[:80]!r}: not 40 hex digits")
                continue
            if fp in queued:
                result.queued_members += 1
                continue
            if fp in left:
                result.left_members += 1
                continue
            pending.append(fp)
            if len(pending) >= batch:
                flush()
                if progress is not None:
                    progress("dupefilter", result.dupefilter_read)
        flush()


def dupefilter_import_warnings(source: Any, key: str, frontier: FrontierCore) -> list[str]:
    """For ``import-dupefilter`` (the fingerprints only, into the DONE filter): put a crawl
    that holds no requests yet in scrapy-redis fingerprint mode, so that the imported
    members match its requests, and say what the fingerprints alone cannot do. Returns
    the warnings to show (empty when all is well)."""
    warnings = []
    try:
        crawl_fingerprint_mode(frontier.client, frontier.keys, "scrapy-redis")
    except ConfigError as exc:
        warnings.append(
            f"{exc}. The imported fingerprints will not match this crawl's requests: "
            "import into a new crawl with `redcrawl import-scrapy-redis SPIDER --crawl NEW`"
        )
    queue = key.removesuffix(":dupefilter") + ":requests"
    with redis_errors("reading the scrapy-redis queue"):
        waiting = key.endswith(":dupefilter") and source.exists(queue)
    if waiting:
        warnings.append(
            f"{queue} still holds queued requests: their fingerprints are in {key} too, so "
            "they are marked done here and never fetched. `redcrawl import-scrapy-redis "
            "SPIDER` moves the queue as well"
        )
    return warnings
