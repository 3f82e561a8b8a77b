"""Response bodies of the HTTP API. A response that shows a frontier record is built from
the record (pydantic's ``from_attributes``, :class:`_Record`), so a field added to a record
shows up here as a mismatch (tests/test_api.py) rather than silently missing. The request
bodies are in :mod:`redcrawl.api.inputs` and re-exported here."""

from __future__ import annotations

import base64
import dataclasses
import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from redcrawl.api import inputs
from redcrawl.api.inputs import MAX_BODY_CHARS as MAX_BODY_CHARS
from redcrawl.api.inputs import MAX_DELAY as MAX_DELAY
from redcrawl.api.inputs import MAX_HEADERS as MAX_HEADERS
from redcrawl.api.inputs import MAX_LIST_LIMIT as MAX_LIST_LIMIT
from redcrawl.api.inputs import MAX_URL_LENGTH as MAX_URL_LENGTH
from redcrawl.api.inputs import META_VALUE_SCHEMA as META_VALUE_SCHEMA
from redcrawl.api.inputs import REQUEST_ID_PATTERN as REQUEST_ID_PATTERN
from redcrawl.api.inputs import HostOverrideIn as HostOverrideIn
from redcrawl.api.inputs import RequestIn as RequestIn
from redcrawl.api.inputs import RequeueIn as RequeueIn
from redcrawl.api.inputs import SubmitIn as SubmitIn
from redcrawl.connection import redact
from redcrawl.politeness.describe import PolitenessSummary

if TYPE_CHECKING:
    from redcrawl.codec import Envelope
    from redcrawl.frontier.base import RequestInfo

__all__ = [
    "CrawlDetail",
    "CrawlList",
    "CrawlListItem",
    "CrawlSummary",
    "DeadItem",
    "DeadList",
    "ErrorItem",
    "ErrorOut",
    "Health",
    "HostItem",
    "HostLimit",
    "HostList",
    "HostOut",
    "HostRobots",
    "InflightItem",
    "InflightList",
    "PausedOut",
    "PendingItem",
    "PendingList",
    "PurgedOut",
    "Rates",
    "ReclaimedOut",
    "RequestDetail",
    "RequeuedOut",
    "SubmitItem",
    "SubmitOut",
    "WorkerItem",
    "WorkerList",
]
__all__ += inputs.__all__  # the request bodies, re-exported


def printable(text: str) -> str:
    """``text`` safe to put in a JSON response (no lone surrogates)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


Printable = Annotated[str, AfterValidator(printable)]
"""Text from Redis (an error message, a meta key): made printable, never refused."""


class _Record(BaseModel):
    """A response built from a frontier record (``Model.model_validate(record)``): its
    fields are read from the record's attributes, never listed a second time."""

    model_config = ConfigDict(from_attributes=True)


class SubmitItem(BaseModel):
    accepted: bool = Field(description="False: a duplicate of a stored or done request.")
    id: str | None = Field(
        default=None,
        description="The request id (its fingerprint); "
        "absent for dont_filter requests (their id, #<seq>, is assigned "
        "by Redis: see GET .../pending).",
    )


class SubmitOut(BaseModel):
    crawl: str
    accepted: int
    filtered: int
    items: list[SubmitItem] = Field(description="One per submitted request, in order.")


class ErrorItem(BaseModel):
    loc: str
    msg: str


class ErrorOut(BaseModel):
    detail: str = Field(description="What went wrong and what to do about it.")
    errors: list[ErrorItem] | None = Field(
        default=None, description="Validation errors, one per bad field."
    )


class Health(BaseModel):
    status: Literal["ok"]


class Rates(BaseModel):
    """Per-second rates over (up to) the last minute, from samples this API process took
    when its crawl endpoints were called; null until two samples a second apart exist."""

    window: float | None = Field(description="Seconds covered by the samples.")
    done_per_s: float | None
    accepted_per_s: float | None


class CrawlSummary(BaseModel):
    crawl: str
    accepted: int
    filtered: int
    ready: int
    delayed: int
    in_flight: int
    done: int
    dead: int
    retried: int
    reclaimed: int
    requeued: int
    finished: bool


class CrawlListItem(BaseModel):
    """A crawl in the list: its counts, or (all counts null) the error that kept them from
    being read."""

    crawl: str
    error: str | None = Field(
        default=None,
        description="Why the crawl's counts cannot be "
        "read (its stored state is corrupt); null when they could.",
    )
    accepted: int | None = None
    filtered: int | None = None
    ready: int | None = None
    delayed: int | None = None
    in_flight: int | None = None
    done: int | None = None
    dead: int | None = None
    retried: int | None = None
    reclaimed: int | None = None
    requeued: int | None = None
    finished: bool | None = None


class CrawlList(BaseModel):
    crawls: list[CrawlListItem]


class CrawlDetail(CrawlSummary):
    paused: bool
    workers_alive: int
    rates: Rates
    politeness: PolitenessSummary | None = Field(
        description="Crawl-wide politeness counters (crawls with fleet-wide politeness; null "
        "otherwise): the key mode, keys blocked now by a 429/503, deferrals by reason (the "
        "HTTP status), and the seconds keys with ready work spent closed by their limits "
        "(docs/politeness.md). robots.txt Disallows are counted in robots_disallowed."
    )
    robots_disallowed: int = Field(
        default=0,
        description="Requests robots.txt disallowed, crawl-wide: finished (done) without a "
        "fetch (redcrawl.scrapy.RobotsTxtMiddleware; added by each worker with its heartbeat).",
    )
    lost_partitions: list[int] = Field(
        default_factory=list,
        description="Partitions of a partitioned crawl that lost their state (a Redis master "
        "came back empty) since it was created, with the requests queued, in flight and done "
        "there; empty when none did (and for a crawl of one partition). `redcrawl "
        "accept-loss` goes on without them (docs/cluster.md, 'A partition that lost its state').",
    )


class PendingItem(_Record):
    id: str
    tier: int
    url: str
    priority: int


class PendingList(BaseModel):
    crawl: str
    items: list[PendingItem]


class InflightItem(_Record):
    id: str
    worker: str
    attempts: int
    since: float = Field(description="Leased at (seconds since the epoch, Redis clock).")
    deadline: float = Field(description="Lease deadline (seconds since the epoch).")
    url: str


class InflightList(BaseModel):
    crawl: str
    items: list[InflightItem]


class PendingEntryItem(_Record):
    entry: str = Field(description="Stream entry id.")
    id: str = Field(description='Request id ("?" if the entry is gone).')
    consumer: str = Field(description="The worker holding it.")
    idle: float = Field(description="Seconds since it was delivered or its lease extended.")
    since: float = Field(description="When that was (seconds since the epoch).")
    deliveries: int = Field(description="Delivery count: the request's attempts.")


class ShardItem(_Record):
    shard: int
    stream: Literal["high", "low"]
    key: str
    length: int = Field(description="Entries: ready + pending.")
    ready: int
    pending: int = Field(description="Delivered, not yet acknowledged (in flight).")
    consumers: int
    entries: list[PendingEntryItem] = Field(
        description="Pending entries, oldest first (at most `limit`)."
    )


class ShardList(BaseModel):
    crawl: str
    shards: int = Field(description="The crawl's shard count (REDCRAWL_SHARDS).")
    streams: list[ShardItem] = Field(
        description="Streams that were ever written, high streams first."
    )


class DeadItem(_Record):
    id: str
    died_at: float
    error: Printable
    attempts: int
    url: str


class DeadList(BaseModel):
    crawl: str
    items: list[DeadItem]


class RequestDetail(BaseModel):
    # One stored request: the fields of the frontier's RequestInfo, and its envelope shown
    # as JSON (null if it cannot be decoded); built by `of`. (A comment, not a docstring:
    # a docstring would become the schema's description.) The envelope's fields default to
    # null but stay required in the response schema: every response has them.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    crawl: str
    id: str
    state: Literal["ready", "delayed", "in_flight", "dead"]
    attempts: int
    worker: str | None
    due: float | None
    error: Printable | None
    url: str | None = Field(
        default=None, description="Null if the stored envelope cannot be decoded."
    )
    method: str | None = None
    headers: list[list[str]] | None = Field(default=None, description="[[name, value], ...]")
    body: str | None = None
    body_base64: bool
    meta: dict[str, Any] | None = None
    callback: str | None = None
    priority: int | None = None
    dont_filter: bool | None = None

    @classmethod
    def of(cls, crawl: str, info: RequestInfo) -> RequestDetail:
        """The response for a frontier record: the record's own fields read from it (not
        listed here again), its envelope as :func:`envelope_view` shows it."""
        record = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
        envelope = record.pop("envelope")
        return cls(crawl=crawl, **record, **envelope_view(envelope))


def envelope_view(env: Envelope | None) -> dict[str, Any]:
    """The fields of :class:`RequestDetail` an envelope gives: its own fields as they are,
    the headers as [name, value] pairs, the body as UTF-8 text or base64, the meta made
    JSON-safe. Only ``body_base64`` (false) for an envelope that cannot be decoded."""
    if env is None:
        return {"body_base64": False}
    try:
        body, b64 = env.body.decode("utf-8"), False
    except UnicodeDecodeError:
        body, b64 = base64.b64encode(env.body).decode("ascii"), True
    shown = {
        name: getattr(env, name)
        for name in ("url", "method", "callback", "priority", "dont_filter")
    }
    meta = jsonable(env.meta)
    if isinstance(meta, dict) and isinstance(meta.get("proxy"), str):
        meta["proxy"] = redact(meta["proxy"])
    return {
        **shown,
        "body": body,
        "body_base64": b64,
        "meta": meta,
        "headers": [
            [name, "***" if name.lower() in SECRET_HEADERS else v.decode("latin-1")]
            for k, vs in env.headers
            for name in [k.decode("latin-1")]
            for v in vs
        ],
    }


SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
"""Headers whose values the API never shows (a site's login, a proxy's password): the
request keeps them, a caller with a read token reads ``***``. ``meta["proxy"]`` is shown
with its password hidden too."""


def jsonable(value: Any) -> Any:
    """Stored meta as JSON: bytes as text, non-finite floats as strings, text printable."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {printable(str(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, str):
        return printable(value)
    return value


class RequeuedOut(BaseModel):
    crawl: str
    requeued: int


class ReclaimedOut(BaseModel):
    crawl: str
    worker: str
    reclaimed: int = Field(description="Requests given back to the queue.")


class WorkerItem(BaseModel):
    worker: str
    heartbeat_deadline: float = Field(description="Seconds since the epoch (Redis clock).")
    alive: bool


class WorkerList(BaseModel):
    crawl: str
    server_time: float
    workers: list[WorkerItem]


class PausedOut(BaseModel):
    crawl: str
    paused: bool


class PurgedOut(BaseModel):
    crawl: str
    purged: bool


# --- politeness keys (/v1/crawls/{crawl}/hosts; built from redcrawl.politeness.hosts) ---
class HostLimit(_Record):
    value: float
    source: Literal["default", "DOWNLOAD_SLOTS", "override", "crawl_delay", "auto_delay"] = Field(
        description="Where it comes from: the crawl's default (CONCURRENT_REQUESTS_PER_DOMAIN, "
        "DOWNLOAD_DELAY), DOWNLOAD_SLOTS, the operator's override, robots.txt's Crawl-delay, "
        "AutoThrottle."
    )


class HostConcurrency(HostLimit):
    value: int  # (requests in flight: a whole number)


class HostRobots(_Record):
    origin: str
    status: int | None = Field(description="HTTP status of robots.txt (0: download failed).")
    kind: str | None = Field(description="rules, allow (4xx) or error; null if unreadable.")
    expires_at: float | None = Field(description="Seconds since the epoch (Redis clock).")


class HostItem(_Record):
    key: Printable
    ready: int
    ready_per_tier: list[int]
    in_flight: int
    next_allowed: float | None = Field(
        description="Earliest next grant (seconds since the epoch, Redis clock)."
    )
    blocked_until: float | None = Field(
        description="The later of the operator's block and the 429/503 block, if ahead."
    )
    paused: bool


class HostList(_Record):
    crawl: str
    sort: Literal["ready", "inflight"]
    hosts: list[HostItem]
    next_cursor: str | None = Field(description="Give it as cursor for the next page.")
    scanned: int = Field(description="Keys read (bounded per call).")
    complete: bool = Field(
        description="Every key with ready work or in flight was read; false: the list is "
        "sorted over the keys that open first and those in flight, up to the bounds."
    )
    server_time: float


class HostOut(_Record):
    crawl: str
    key: Printable
    ready: int
    ready_per_tier: list[int]
    in_flight: int
    concurrency: HostConcurrency
    delay: HostLimit
    randomize_delay: bool
    next_allowed: float | None
    block_until: float | None = Field(description="The operator's block (seconds since epoch).")
    block: float | None = Field(description="The adaptive block after 429/503 responses.")
    backoff_failures: int | None
    paused: bool = Field(description="Paused by the operator.")
    crawl_paused: bool
    override: dict[str, Any] = Field(description="The operator's fields of the override.")
    crawl_delay: float | None = Field(description="robots.txt's Crawl-delay (seconds).")
    auto_delay: float | None = Field(description="AutoThrottle's delay (seconds).")
    robots: list[HostRobots]
    why: Printable | None = Field(
        description="Why the key is not served right now, in words; null: it is open."
    )
    server_time: float
    notes: list[str]
