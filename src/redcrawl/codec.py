"""Requests as versioned msgpack envelopes: no pickle, binary-safe, compact.

An :class:`Envelope` is the plain data of one request. :func:`encode` turns it into bytes
(a msgpack map with short keys; fields at their default are left out, so a typical GET
costs little more than its URL), :func:`decode` reads them back and rejects anything
corrupt or written by a future version with :class:`~redcrawl.errors.DecodeError`.

Scrapy requests convert with :func:`from_request` / :func:`to_request`. Callbacks and
errbacks travel by name; the request class by dotted path, and only classes that are
Scrapy ``Request`` subclasses known to the codec (or registered with
:func:`allow_request_class`) are ever imported: data in Redis never chooses code to run.

Wire format, version 1 (msgpack map)::

    v   int      format version (1)
    u   str      URL
    m   str      method, if not GET
    h   list     headers: [[name bytes, [value bytes, ...]], ...]
    b   bytes    body
    c   any      cookies (dict or list of dicts, as Scrapy accepts)
    mt  map      meta
    cb  str      callback name;  eb  str  errback name
    p   int      priority
    fl  list     flags
    df  bool     dont_filter
    k   map      cb_kwargs
    e   str      encoding, if not utf-8
    cls str      request class, if not scrapy.Request
    x   map      extra class attributes (e.g. JsonRequest's dumps_kwargs)
    f   bytes    fingerprint (20 bytes), absent for dont_filter requests
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from redcrawl.errors import DecodeError, EncodeError
from redcrawl.settings import PRIORITY_LIMIT

if TYPE_CHECKING:
    import scrapy

__all__ = [
    "FORMAT_VERSION",
    "Envelope",
    "allow_request_class",
    "decode",
    "encode",
    "from_request",
    "to_request",
]

FORMAT_VERSION = 1
MAX_ENVELOPE_BYTES = 8 * 1024 * 1024

_ALLOWED_CLASSES: set[str] = {
    "scrapy.http.request.Request",
    "scrapy.http.request.form.FormRequest",
    "scrapy.http.request.json_request.JsonRequest",
    "scrapy.http.request.rpc.XmlRpcRequest",
    "scrapy.http.FormRequest",
    "scrapy.http.JsonRequest",
    "scrapy.http.XmlRpcRequest",
}

_JSONISH = (str, int, float, bool, bytes, type(None))


@dataclass(slots=True, kw_only=True)
class Envelope:
    """The stored form of one request."""

    url: str
    method: str = "GET"
    headers: list[tuple[bytes, list[bytes]]] = field(default_factory=list)
    body: bytes = b""
    cookies: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    callback: str | None = None
    errback: str | None = None
    priority: int = 0
    flags: list[str] = field(default_factory=list)
    dont_filter: bool = False
    cb_kwargs: dict[str, Any] = field(default_factory=dict)
    encoding: str = "utf-8"
    request_class: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    fingerprint: bytes | None = None


def allow_request_class(path: str) -> None:
    """Allow envelopes to name the request class at ``path`` (``module.Class``)."""
    _ALLOWED_CLASSES.add(path)


def _check_value(value: Any, path: str, depth: int = 0) -> None:
    if depth > 32:
        raise EncodeError(f"{path} is nested more than 32 levels deep; flatten it")
    if isinstance(value, _JSONISH):
        if isinstance(value, int) and not isinstance(value, bool) and not (
            -(2**63) <= value < 2**64
        ):
            raise EncodeError(f"{path} = {value} does not fit in 64 bits; store it as a string")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_value(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise EncodeError(f"{path} has a non-string key {k!r}; use string keys")
            _check_value(item, f"{path}[{k!r}]", depth + 1)
        return
    raise EncodeError(
        f"{path} holds a {type(value).__name__}, which cannot be stored in Redis; keep to "
        "str, int, float, bool, None, bytes, lists and dicts (or remove the key before "
        "the request is scheduled)"
    )


def encode(env: Envelope) -> bytes:
    """Envelope -> bytes. Raises :class:`EncodeError` naming the value that can't be stored."""
    if not isinstance(env.url, str) or not env.url:
        raise EncodeError(f"request URL {env.url!r} must be a non-empty string")
    if not isinstance(env.priority, int) or not -PRIORITY_LIMIT <= env.priority <= PRIORITY_LIMIT:
        raise EncodeError(
            f"priority {env.priority!r} of {env.url} is outside ±{PRIORITY_LIMIT}; use a "
            "smaller integer"
        )
    d: dict[str, Any] = {"v": FORMAT_VERSION, "u": env.url}
    if env.method != "GET":
        d["m"] = env.method
    if env.headers:
        d["h"] = [[k, list(v)] for k, v in env.headers]
    if env.body:
        d["b"] = bytes(env.body)
    if env.cookies:
        _check_value(env.cookies, "cookies")
        d["c"] = env.cookies
    if env.meta:
        _check_value(env.meta, "meta")
        d["mt"] = env.meta
    if env.callback:
        d["cb"] = env.callback
    if env.errback:
        d["eb"] = env.errback
    if env.priority:
        d["p"] = env.priority
    if env.flags:
        d["fl"] = list(env.flags)
    if env.dont_filter:
        d["df"] = True
    if env.cb_kwargs:
        _check_value(env.cb_kwargs, "cb_kwargs")
        d["k"] = env.cb_kwargs
    if env.encoding != "utf-8":
        d["e"] = env.encoding
    if env.request_class:
        d["cls"] = env.request_class
    if env.extra:
        _check_value(env.extra, "request attributes")
        d["x"] = env.extra
    if env.fingerprint is not None and not env.dont_filter:
        d["f"] = env.fingerprint
    data: bytes = msgpack.packb(d, use_bin_type=True)
    if len(data) > MAX_ENVELOPE_BYTES:
        raise EncodeError(
            f"request {env.url} encodes to {len(data)} bytes, over the "
            f"{MAX_ENVELOPE_BYTES}-byte limit; keep large payloads out of meta and body"
        )
    return data


def _typed(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = d.get(key, default)
    if value is not default and not isinstance(value, kind):
        raise DecodeError(f"envelope field {key!r} has type {type(value).__name__}")
    return value


def decode(data: bytes) -> Envelope:
    """Bytes -> Envelope. Raises :class:`DecodeError` for corrupt or future envelopes."""
    try:
        d = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises a variety of ValueError subclasses
        raise DecodeError(f"envelope is not valid msgpack ({exc.__class__.__name__}: {exc})")
    if not isinstance(d, dict):
        raise DecodeError(f"envelope is a {type(d).__name__}, not a map")
    version = d.get("v")
    if version != FORMAT_VERSION:
        raise DecodeError(
            f"envelope format version {version!r} is not supported by this redcrawl "
            f"(reads version {FORMAT_VERSION}); upgrade the workers or requeue the request"
        )
    url = d.get("u")
    if not isinstance(url, str) or not url:
        raise DecodeError("envelope has no URL")
    headers = _typed(d, "h", list, [])
    try:
        hdrs = [(bytes(k), [bytes(x) for x in vs]) for k, vs in headers]
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"envelope headers are malformed ({exc})")
    return Envelope(
        url=url,
        method=_typed(d, "m", str, "GET"),
        headers=hdrs,
        body=_typed(d, "b", bytes, b""),
        cookies=d.get("c"),
        meta=_typed(d, "mt", dict, {}),
        callback=_typed(d, "cb", str, None),
        errback=_typed(d, "eb", str, None),
        priority=_typed(d, "p", int, 0),
        flags=_typed(d, "fl", list, []),
        dont_filter=_typed(d, "df", bool, False),
        cb_kwargs=_typed(d, "k", dict, {}),
        encoding=_typed(d, "e", str, "utf-8"),
        request_class=_typed(d, "cls", str, None),
        extra=_typed(d, "x", dict, {}),
        fingerprint=_typed(d, "f", bytes, None),
    )


# --- Scrapy requests ------------------------------------------------------------------

_BASE_ATTRS = frozenset(
    ("url", "callback", "errback", "headers", "method", "body", "cookies", "meta", "encoding",
     "priority", "dont_filter", "flags", "cb_kwargs")
)


def from_request(
    request: scrapy.Request, spider: scrapy.Spider | None = None, *,
    fingerprint: bytes | None = None,
) -> Envelope:
    """Scrapy request -> Envelope. Callbacks must be methods of ``spider`` (by name)."""
    try:
        d = request.to_dict(spider=spider)
    except ValueError as exc:
        raise EncodeError(
            f"request {request.url}: {exc}. Callbacks must be spider methods, not lambdas or "
            "module functions, so a worker can look them up by name"
        ) from None
    cls_path = d.get("_class")
    if cls_path is not None and cls_path not in _ALLOWED_CLASSES:
        raise EncodeError(
            f"request class {cls_path} is not allowed in envelopes; call "
            f"redcrawl.codec.allow_request_class({cls_path!r}) at import time of your project"
        )
    for name in ("callback", "errback"):
        if d[name] is not None and not isinstance(d[name], str):
            raise EncodeError(f"request {request.url}: {name} {d[name]!r} has no name")
    extra = {k: v for k, v in d.items() if k not in _BASE_ATTRS and k != "_class"}
    return Envelope(
        url=d["url"],
        method=d["method"],
        headers=[(bytes(k), list(v)) for k, v in d["headers"].items()],
        body=d["body"],
        cookies=d["cookies"] or None,
        meta=d["meta"],
        callback=d["callback"],
        errback=d["errback"],
        priority=d["priority"],
        flags=d["flags"],
        dont_filter=d["dont_filter"],
        cb_kwargs=d["cb_kwargs"],
        encoding=d["encoding"],
        request_class=cls_path,
        extra=extra,
        fingerprint=fingerprint,
    )


def _load_class(path: str) -> type[scrapy.Request]:
    import scrapy

    if path not in _ALLOWED_CLASSES:
        raise DecodeError(
            f"envelope names request class {path!r}, which is not allowed; register it with "
            "redcrawl.codec.allow_request_class() in the worker"
        )
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise DecodeError(f"request class {path!r} cannot be imported ({exc})")
    if not (isinstance(cls, type) and issubclass(cls, scrapy.Request)):
        raise DecodeError(f"{path!r} is not a scrapy.Request subclass")
    return cls


def _method(spider: Any, name: str | None, what: str) -> Any:
    if name is None or spider is None:
        return name
    fn = getattr(spider, name, None)
    if name.startswith("__") or not callable(fn):
        raise DecodeError(f"{what} {name!r} is not a method of spider {spider.name!r}")
    return fn


def to_request(env: Envelope, spider: scrapy.Spider | None = None) -> scrapy.Request:
    """Envelope -> Scrapy request, callbacks resolved on ``spider``."""
    import scrapy

    cls = _load_class(env.request_class) if env.request_class else scrapy.Request
    kwargs: dict[str, Any] = {
        "url": env.url,
        "method": env.method,
        "headers": {k: v for k, v in env.headers} if env.headers else None,
        "body": env.body or None,
        "cookies": env.cookies,
        "meta": env.meta or None,
        "encoding": env.encoding,
        "priority": env.priority,
        "dont_filter": env.dont_filter,
        "flags": env.flags or None,
        "cb_kwargs": env.cb_kwargs or None,
        "callback": _method(spider, env.callback, "callback"),
        "errback": _method(spider, env.errback, "errback"),
    }
    for key, value in env.extra.items():
        if key in cls.attributes:
            kwargs[key] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"cannot rebuild request {env.url}: {exc}")
