"""Requests as versioned msgpack envelopes: no pickle, binary-safe, compact.

An :class:`Envelope` is the plain data of one request. :func:`encode` turns it into bytes
(a msgpack map with short keys; fields at their default are left out, so a typical GET
costs little more than its URL), :func:`decode` reads them back and rejects anything
corrupt or written by a future version with :class:`~redcrawl.errors.DecodeError`.

Scrapy requests convert with :func:`from_request` / :func:`to_request`. Callbacks and
errbacks travel by name; the request class by dotted path, and only classes that are
Scrapy ``Request`` subclasses known to the codec (or registered with
:func:`allow_request_class`) are ever imported: data in Redis never chooses code to run.

Wire format (msgpack map). Version 1 holds plain data only; version 2 is version 1 plus
the extension types below, and is written only when a value needs one, so an envelope of
plain data stays readable by workers that know version 1 only. Both are read::

    v   int      format version (1, or 2 when an extension type is inside)
    u   str      URL
    m   str      method, if not GET
    h   list     headers: [[name bytes, [value bytes, ...]], ...]
    b   bytes    body
    c   any      cookies (dict or list of dicts, as Scrapy accepts)
    mt  map      meta (keys: any storable hashable value, usually str)
    cb  str      callback name;  eb  str  errback name
    p   int      priority
    fl  list     flags
    df  bool     dont_filter
    k   map      cb_kwargs (str keys)
    e   str      encoding, if not utf-8
    cls str      request class, if not scrapy.Request
    x   map      extra class attributes (e.g. JsonRequest's dumps_kwargs)
    f   bytes    fingerprint (20 bytes), absent for dont_filter requests

Extension types (version 2; msgpack ext code: payload), inside meta, cb_kwargs, cookies
and extra attributes::

    1   tuple       msgpack array of the items
    2   set         msgpack array
    3   frozenset   msgpack array
    4   datetime    [naive ISO 8601 str, fold int, tz]; tz is nil, [offset µs, name|nil]
                    (datetime.timezone) or an IANA key str (zoneinfo.ZoneInfo)
    5   date        ISO 8601 str (UTF-8)
    6   time        [naive ISO 8601 str, fold int, tz] as for datetime
    7   timedelta   [days, seconds, microseconds]
    8   Decimal     str(value) (UTF-8)
    9   UUID        16 bytes
    10  item        [class path "module:qualname", kind "item"|"dataclass"|"attrs",
                    {field: value}]: a scrapy.Item, dataclass or attrs instance

An item's class is never imported because of stored data: a worker finds it among the
modules it has imported already (the spider's own imports), and uses it only if it is a
``scrapy.Item`` subclass, a dataclass or an attrs class of the recorded kind. Instances are
rebuilt as pickle does, without calling ``__init__`` (no project code runs at decode).

Where things are: ``envelope.py`` Envelope <-> bytes (encode, decode); ``msgpack_types.py``
the extension types; this module Scrapy requests <-> Envelope and the class allow-list.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from types import MethodType
from typing import TYPE_CHECKING, Any, cast

from redcrawl.callbacks import callback_problem
from redcrawl.envelope import FORMAT_VERSION as FORMAT_VERSION
from redcrawl.envelope import MAX_ENVELOPE_BYTES as MAX_ENVELOPE_BYTES
from redcrawl.envelope import PLAIN_VERSION as PLAIN_VERSION
from redcrawl.envelope import READ_VERSIONS as READ_VERSIONS
from redcrawl.envelope import Envelope as Envelope
from redcrawl.envelope import blank
from redcrawl.envelope import decode as decode
from redcrawl.envelope import encode as encode
from redcrawl.errors import DecodeError, EncodeError
from redcrawl.msgpack_types import MAX_DEPTH as MAX_DEPTH
from redcrawl.msgpack_types import StoredItem as StoredItem
from redcrawl.msgpack_types import resolve_items

if TYPE_CHECKING:
    import scrapy

__all__ = [
    "FORMAT_VERSION",
    "Envelope",
    "StoredItem",
    "allow_request_class",
    "decode",
    "encode",
    "from_request",
    "request_url",
    "to_request",
]

_ALLOWED_CLASSES: set[str] = {
    "scrapy.http.request.Request",
    "scrapy.http.request.form.FormRequest",
    "scrapy.http.request.json_request.JsonRequest",
    "scrapy.http.request.rpc.XmlRpcRequest",
    "scrapy.http.FormRequest",
    "scrapy.http.JsonRequest",
    "scrapy.http.XmlRpcRequest",
}


def allow_request_class(path: str) -> None:
    """Allow envelopes to name the request class at ``path`` (``module.Class``)."""
    _ALLOWED_CLASSES.add(path)


# --- Scrapy requests ------------------------------------------------------------------

_BASE_ATTRS = frozenset(
    (
        "url",
        "callback",
        "errback",
        "headers",
        "method",
        "body",
        "cookies",
        "meta",
        "encoding",
        "priority",
        "dont_filter",
        "flags",
        "cb_kwargs",
    )
)


def _callback_name(spider: Any, func: Any, url: str, what: str) -> str | None:
    """The name under which ``func`` is a method of ``spider`` (Scrapy's rule, without
    scanning every member in the common case), if the callback rule allows that name."""
    if func is None:
        return None
    if isinstance(func, str):
        name: str | None = func
    else:
        name = None
        target = getattr(func, "__func__", None)
        if spider is not None and target is not None:
            fname = target.__name__
            # the common case first: a method found under its own name
            if getattr(getattr(spider, fname, None), "__func__", None) is target:
                name = fname
            else:
                name = _method_name(spider, target, fname)
    if name is None:
        raise EncodeError(
            f"request {url}: {what} {func!r} is not a method of the spider. Callbacks "
            "must be spider methods, not lambdas, partials or module functions, so a worker "
            "can look them up by name; pass a callback's arguments with cb_kwargs, e.g. "
            "Request(url, callback=self.parse_item, cb_kwargs={'page': 2})"
        )
    problem = callback_problem(spider, name) if spider is not None else None
    if problem is not None:
        raise EncodeError(
            f"request {url}: {what} {problem}. A stored request may only name "
            "a public method of your spider's own class"
        )
    return name


def _method_name(spider: Any, target: Any, fname: str) -> str | None:
    """The name of the method of ``spider`` whose function is ``target``, when it is not
    ``fname``: a name-mangled private method, or one bound under another name."""
    candidates = []
    if fname.startswith("__") and not fname.endswith("__"):  # name-mangled private
        candidates += [f"_{c.__name__.lstrip('_')}{fname}" for c in type(spider).__mro__]
    for candidate in candidates:
        found = getattr(spider, candidate, None)
        if getattr(found, "__func__", None) is target:
            return str(candidate)
    for member_name, member in inspect.getmembers(spider, predicate=inspect.ismethod):
        if member.__func__ is target:
            return str(member_name)
    return None


_MISSING: Any = object()

_REQUEST: Any = None
"""``scrapy.Request``, once :func:`_request_class` ran (an import statement on the hot
path costs a tenth of a microsecond; scrapy is imported lazily)."""


def _request_class() -> Any:
    global _REQUEST
    import scrapy

    _REQUEST = scrapy.Request
    return _REQUEST


def from_request(
    request: scrapy.Request,
    spider: scrapy.Spider | None = None,
    *,
    fingerprint: bytes | None = None,
) -> Envelope:
    """Scrapy request -> Envelope. Callbacks must be methods of ``spider`` (by name)."""
    cls = type(request)
    if cls is not _REQUEST and cls is not _request_class():
        cls_path = f"{cls.__module__}.{cls.__name__}"
        if cls_path not in _ALLOWED_CLASSES:
            raise EncodeError(
                f"request class {cls_path} is not allowed in envelopes; call "
                f"redcrawl.codec.allow_request_class({cls_path!r}) at import time of your "
                "project"
            )
        env = blank(request.url)
        env.request_class = cls_path
        env.extra = {a: getattr(request, a) for a in cls.attributes if a not in _BASE_ATTRS}
    else:
        env = blank(request.url)
    url = env.url
    # (the containers read from their slots: Scrapy 2.13+ creates an empty one on first
    # access to the public property, which costs more than the rest of encoding)
    headers = getattr(request, "_headers", _MISSING)
    if headers is _MISSING:
        headers = request.headers
    if headers:
        env.headers = [(bytes(k), list(v)) for k, v in headers.items()]
    env.method = request.method
    env.body = request.body
    cookies = getattr(request, "_cookies", _MISSING)
    if cookies is _MISSING:
        cookies = request.cookies
    if cookies:
        env.cookies = cookies
    meta = getattr(request, "_meta", _MISSING)
    if meta is _MISSING:
        meta = request.meta
    if meta:
        env.meta = meta
    callback = request.callback
    if callback is not None:
        env.callback = _callback_name(spider, callback, url, "callback")
    errback = request.errback
    if errback is not None:
        env.errback = _callback_name(spider, errback, url, "errback")
    env.priority = request.priority
    flags = getattr(request, "_flags", _MISSING)
    if flags is _MISSING:
        flags = request.flags
    if flags:
        env.flags = flags
    env.dont_filter = request.dont_filter
    cb_kwargs = getattr(request, "_cb_kwargs", _MISSING)
    if cb_kwargs is _MISSING:
        cb_kwargs = request.cb_kwargs
    if cb_kwargs:
        env.cb_kwargs = cb_kwargs
    env.encoding = request.encoding
    env.fingerprint = fingerprint
    return env


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
    problem = callback_problem(spider, name)
    if problem is not None:
        raise DecodeError(f"{what} {problem}; refused (spider {spider.name!r})")
    fn = getattr(spider, name, None)
    if type(fn) is not MethodType or fn.__self__ is not spider:
        raise DecodeError(f"{what} {name!r} is not a method of spider {spider.name!r}")
    return fn


def to_request(env: Envelope, spider: scrapy.Spider | None = None) -> scrapy.Request:  # noqa: C901 (one branch per optional Request argument: the hot path, flat)
    """Envelope -> Scrapy request, callbacks resolved on ``spider`` (without a spider the
    request has no callback, so Scrapy uses the spider's default ``parse``). Whatever the
    envelope holds, the only error is :class:`DecodeError`."""
    try:
        if env.unresolved:
            env.meta = resolve_items(env.meta)
            env.cb_kwargs = resolve_items(env.cb_kwargs)
            env.unresolved = False
        cls = _load_class(env.request_class) if env.request_class else _REQUEST or _request_class()
        url = env.url
        kwargs: dict[str, Any] = {"url": url}
        # Only what differs from Request's defaults: construction is a worker's hot path.
        if env.callback:
            kwargs["callback"] = _method(spider, env.callback, "callback")
        if env.priority:
            kwargs["priority"] = env.priority
        if env.meta:
            kwargs["meta"] = env.meta
        if env.method != "GET":
            kwargs["method"] = env.method
        if env.headers:
            kwargs["headers"] = dict(env.headers)
        if env.body:
            kwargs["body"] = env.body
        if env.cookies:
            kwargs["cookies"] = env.cookies
        if env.encoding != "utf-8":
            kwargs["encoding"] = env.encoding
        if env.dont_filter:
            kwargs["dont_filter"] = True
        if env.flags:
            kwargs["flags"] = env.flags
        if env.cb_kwargs:
            kwargs["cb_kwargs"] = env.cb_kwargs
        if env.errback:
            kwargs["errback"] = _method(spider, env.errback, "errback")
        if env.extra:
            for key, value in env.extra.items():
                if key in cls.attributes:
                    kwargs[key] = value
        fast = _FAST_CLASSES.get(cls, _MISSING)
        if fast is _MISSING:
            fast = _FAST_CLASSES[cls] = _trusting_class(cast(Any, cls))
        if fast is None or not _PLAIN_URL(url) or "#!" in url:
            return cls(**kwargs)
        # Scrapy's URL escaping (safe_url_string) is most of what building a Request
        # costs, and a stored URL has already been through it (it is a Request's .url):
        # build through a subclass that keeps the URL as it is, then hand out the class
        # itself. Same object, same type, registered with trackref as usual.
        request: scrapy.Request = cls.__new__(cls)
        request.__class__ = fast
        fast.__init__(request, **kwargs)
        request.__class__ = cls
        return request
    except DecodeError:
        raise
    except Exception as exc:  # whatever a corrupt envelope makes Scrapy raise
        raise DecodeError(
            f"cannot rebuild request {env.url!r}: {exc.__class__.__name__}: {exc}"
        ) from None


_FAST_CLASSES: dict[Any, Any] = {}
"""Request class -> its :func:`_trusting_class` (None: built the ordinary way)."""


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
        cls, "_set_url"
    ):
        return None
    fast: Any = type(f"_Stored{cls.__name__}", (cls,), {"__slots__": (), "_set_url": _keep_url})
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
