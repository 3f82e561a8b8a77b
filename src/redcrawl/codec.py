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

import functools
import importlib
import inspect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

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
    "request_url",
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


def encode(env: Envelope, *, fingerprint: bool = True) -> bytes:
    """Envelope -> bytes. Raises :class:`EncodeError` naming the value that can't be stored.

    ``fingerprint=False`` leaves the fingerprint out (the frontier stores it as the
    request's id instead)."""
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
        if not all(isinstance(f, str) for f in env.flags):
            raise EncodeError(f"request {env.url}: flags must be strings, got {env.flags!r}")
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
    if fingerprint and env.fingerprint is not None and not env.dont_filter:
        d["f"] = env.fingerprint
    try:
        data: bytes = msgpack.packb(d, use_bin_type=True)
    except (TypeError, ValueError, UnicodeEncodeError, OverflowError) as exc:
        raise EncodeError(f"request {env.url} cannot be encoded: {exc}")
    if len(data) > MAX_ENVELOPE_BYTES:
        raise EncodeError(
            f"request {env.url} encodes to {len(data)} bytes, over the "
            f"{MAX_ENVELOPE_BYTES}-byte limit; keep large payloads out of meta and body"
        )
    return data


# short key -> (Envelope attribute, required type or None for "any")
_FIELDS: dict[str, tuple[str, type | tuple[type, ...] | None]] = {
    "m": ("method", str),
    "h": ("headers", list),
    "b": ("body", bytes),
    "c": ("cookies", None),
    "mt": ("meta", dict),
    "cb": ("callback", str),
    "eb": ("errback", str),
    "p": ("priority", int),
    "fl": ("flags", list),
    "df": ("dont_filter", bool),
    "k": ("cb_kwargs", dict),
    "e": ("encoding", str),
    "cls": ("request_class", str),
    "x": ("extra", dict),
    "f": ("fingerprint", bytes),
}


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
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        spec = _FIELDS.get(key)
        if spec is None:
            continue  # "v", "u", or a field this version does not know: ignored
        attr, kind = spec
        if (kind is not None and not isinstance(value, kind)) or (
            kind is int and isinstance(value, bool)
        ):
            raise DecodeError(f"envelope field {key!r} has type {type(value).__name__}")
        kwargs[attr] = value
    if "headers" in kwargs:
        kwargs["headers"] = _decode_headers(kwargs["headers"])
    return Envelope(url=url, **kwargs)


def _decode_headers(headers: list[Any]) -> list[tuple[bytes, list[bytes]]]:
    out: list[tuple[bytes, list[bytes]]] = []
    for item in headers:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], bytes)
                or not isinstance(item[1], list)
                or not all(isinstance(x, bytes) for x in item[1])):
            raise DecodeError("envelope headers are malformed: want [[name, [values]], ...] "
                              "of bytes")
        out.append((item[0], item[1]))
    return out


# --- Scrapy requests ------------------------------------------------------------------

_BASE_ATTRS = frozenset(
    ("url", "callback", "errback", "headers", "method", "body", "cookies", "meta", "encoding",
     "priority", "dont_filter", "flags", "cb_kwargs")
)


def _callback_name(spider: Any, func: Any, url: str, what: str) -> str | None:
    """The name under which ``func`` is a method of ``spider`` (Scrapy's rule, without
    scanning every member in the common case)."""
    if func is None or isinstance(func, str):
        return func
    target = getattr(func, "__func__", None)
    if spider is not None and target is not None:
        name = target.__name__
        candidates = [name]
        if name.startswith("__") and not name.endswith("__"):  # name-mangled private
            candidates += [f"_{c.__name__.lstrip('_')}{name}" for c in type(spider).__mro__]
        for candidate in candidates:
            found = getattr(spider, candidate, None)
            if getattr(found, "__func__", None) is target:
                return str(candidate)
        for member_name, member in inspect.getmembers(spider, predicate=inspect.ismethod):
            if member.__func__ is target:
                return str(member_name)
    raise EncodeError(
        f"request {url}: {what} {func!r} is not a method of the spider. Callbacks must be "
        "spider methods, not lambdas or module functions, so a worker can look them up by "
        "name"
    )


_MISSING = object()


def _peek(request: Any, name: str) -> Any:
    """``request.<name>`` without making an empty container: Scrapy 2.13+ creates one on
    first access to the public property, which costs more than the rest of encoding."""
    value = getattr(request, "_" + name, _MISSING)
    return getattr(request, name) if value is _MISSING else value


def from_request(
    request: scrapy.Request, spider: scrapy.Spider | None = None, *,
    fingerprint: bytes | None = None,
) -> Envelope:
    """Scrapy request -> Envelope. Callbacks must be methods of ``spider`` (by name)."""
    import scrapy

    cls = type(request)
    cls_path = None
    extra: dict[str, Any] = {}
    if cls is not scrapy.Request:
        cls_path = f"{cls.__module__}.{cls.__name__}"
        if cls_path not in _ALLOWED_CLASSES:
            raise EncodeError(
                f"request class {cls_path} is not allowed in envelopes; call "
                f"redcrawl.codec.allow_request_class({cls_path!r}) at import time of your "
                "project"
            )
        extra = {a: getattr(request, a) for a in cls.attributes if a not in _BASE_ATTRS}
    headers = _peek(request, "headers")
    return Envelope(
        url=request.url,
        method=request.method,
        headers=[(bytes(k), list(v)) for k, v in headers.items()] if headers else [],
        body=request.body,
        cookies=_peek(request, "cookies") or None,
        meta=_peek(request, "meta") or {},
        callback=_callback_name(spider, request.callback, request.url, "callback"),
        errback=_callback_name(spider, request.errback, request.url, "errback"),
        priority=request.priority,
        flags=_peek(request, "flags") or [],
        dont_filter=request.dont_filter,
        cb_kwargs=_peek(request, "cb_kwargs") or {},
        encoding=request.encoding,
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
    """The spider's bound method ``name``; without a spider, no callback (None)."""
    if name is None or spider is None:
        return None
    fn = getattr(spider, name, None)
    if name.startswith("__") or not inspect.ismethod(fn) or fn.__self__ is not spider:
        raise DecodeError(f"{what} {name!r} is not a method of spider {spider.name!r}")
    return fn


def to_request(env: Envelope, spider: scrapy.Spider | None = None) -> scrapy.Request:
    """Envelope -> Scrapy request, callbacks resolved on ``spider`` (without a spider the
    request has no callback, so Scrapy uses the spider's default ``parse``)."""
    import scrapy

    cls = _load_class(env.request_class) if env.request_class else scrapy.Request
    kwargs: dict[str, Any] = {"url": env.url}
    # Only what differs from Request's defaults: construction is a worker's hot path.
    if env.method != "GET":
        kwargs["method"] = env.method
    if env.headers:
        kwargs["headers"] = dict(env.headers)
    if env.body:
        kwargs["body"] = env.body
    if env.cookies:
        kwargs["cookies"] = env.cookies
    if env.meta:
        kwargs["meta"] = env.meta
    if env.encoding != "utf-8":
        kwargs["encoding"] = env.encoding
    if env.priority:
        kwargs["priority"] = env.priority
    if env.dont_filter:
        kwargs["dont_filter"] = True
    if env.flags:
        kwargs["flags"] = env.flags
    if env.cb_kwargs:
        kwargs["cb_kwargs"] = env.cb_kwargs
    if env.callback:
        kwargs["callback"] = _method(spider, env.callback, "callback")
    if env.errback:
        kwargs["errback"] = _method(spider, env.errback, "errback")
    for key, value in env.extra.items():
        if key in cls.attributes:
            kwargs[key] = value
    try:
        plain = _PLAIN_URL(env.url) and "#!" not in env.url
        fast = _trusting_class(cast(Any, cls)) if plain else None
        if fast is None:
            return cls(**kwargs)
        # Scrapy's URL escaping (safe_url_string) is most of what building a Request
        # costs, and a stored URL has already been through it (it is a Request's .url):
        # build through a subclass that keeps the URL as it is, then hand out the class
        # itself. Same object, same type, registered with trackref as usual.
        request = cls.__new__(cls)
        request.__class__ = fast
        fast.__init__(request, **kwargs)
        request.__class__ = cls
        return request
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"cannot rebuild request {env.url}: {exc}")


# An http(s) URL in the form Scrapy's URL escaping (safe_url_string) leaves as it is:
# lowercase host, a port only with digits, at most one "#", only characters it never
# escapes. Envelopes hold a Request's .url, escaped already, or a URL normalised by
# request_url; this check keeps anything else on Scrapy's own path.
_PLAIN_URL = re.compile(
    r"https?://[a-z0-9.-]+(?::[0-9]+)?"
    r"(?:/[A-Za-z0-9\-._~:/@!$&'()*+,;=%]*(?:\?[A-Za-z0-9\-._~:/?@!$&()*+,;=%]+)?)?"
    r"(?:#[A-Za-z0-9\-._~:/?@!$&'()*+,;=%]+)?"
).fullmatch

_TRUSTED_CLASSES = frozenset(_ALLOWED_CLASSES)
"""Scrapy's own request classes: their constructors do nothing else with the URL."""


def _keep_url(self: Any, url: str) -> None:
    self._url = url


@functools.cache
def _trusting_class(cls: Any) -> Any:
    """For one of Scrapy's own request classes, a subclass of the same memory layout
    whose URL setter keeps the URL as given (None if this Scrapy does not allow it)."""
    if f"{cls.__module__}.{cls.__qualname__}" not in _TRUSTED_CLASSES or not hasattr(
            cls, "_set_url"):
        return None
    fast: Any = type(f"_Stored{cls.__name__}", (cls,),
                     {"__slots__": (), "_set_url": _keep_url})
    url = "http://example.com/a?b=1#c"
    try:  # this Scrapy builds it the same both ways, and lets the class be swapped
        probe = cls.__new__(cls)
        probe.__class__ = fast
        fast.__init__(probe, url)
        probe.__class__ = cls
    except (TypeError, AttributeError, ValueError):
        return None
    return fast if type(probe) is cls and probe.url == cls(url).url == url else None


def request_url(url: str) -> str:
    """``url`` as a Scrapy request holds it (escaped), which is how envelopes store
    URLs. :class:`~redcrawl.errors.EncodeError` if Scrapy would not make a request of it."""
    import scrapy

    try:
        return str(scrapy.Request(url).url)
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"cannot make a request of URL {url!r}: {exc}") from None
