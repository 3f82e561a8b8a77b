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
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import functools
import importlib
import inspect
import re
import sys
import uuid
import zoneinfo
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import msgpack
from msgpack import packb, unpackb

from redcrawl.callbacks import callback_problem
from redcrawl.errors import DecodeError, EncodeError
from redcrawl.settings import PRIORITY_LIMIT

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

FORMAT_VERSION = 2
"""The newest envelope format this codec reads and writes (see the table above)."""
PLAIN_VERSION = 1
"""The version written when an envelope holds no extension type."""
READ_VERSIONS = frozenset({1, 2})
MAX_ENVELOPE_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 500
"""Nesting depth reported when msgpack refuses a structure as too deep (its own limit is
about 1,000 levels of lists and maps, fewer of tuples and sets)."""

_ALLOWED_CLASSES: set[str] = {
    "scrapy.http.request.Request",
    "scrapy.http.request.form.FormRequest",
    "scrapy.http.request.json_request.JsonRequest",
    "scrapy.http.request.rpc.XmlRpcRequest",
    "scrapy.http.FormRequest",
    "scrapy.http.JsonRequest",
    "scrapy.http.XmlRpcRequest",
}


@dataclass(slots=True, kw_only=True)
class Envelope:
    """The stored form of one request."""

    url: str
    method: str = "GET"
    headers: list[tuple[bytes, list[bytes]]] = field(default_factory=list)
    body: bytes = b""
    cookies: Any = None
    meta: dict[Any, Any] = field(default_factory=dict)
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
    unresolved: bool = field(default=False, repr=False, compare=False)
    """True when meta/cb_kwargs hold a :class:`StoredItem` whose class this process has
    not imported (yet): :func:`to_request` looks it up again, or fails with DecodeError."""


@dataclass(slots=True, frozen=True, eq=False)
class StoredItem:
    """An item read from an envelope whose class the reading process has not imported
    (e.g. ``redcrawl dead`` or the API showing a request). Encodes back unchanged."""

    path: str
    kind: str
    fields: dict[str, Any]


def allow_request_class(path: str) -> None:
    """Allow envelopes to name the request class at ``path`` (``module.Class``)."""
    _ALLOWED_CLASSES.add(path)


# --- extension types -------------------------------------------------------------------

_EXT_TUPLE, _EXT_SET, _EXT_FROZENSET, _EXT_DATETIME, _EXT_DATE = 1, 2, 3, 4, 5
_EXT_TIME, _EXT_TIMEDELTA, _EXT_DECIMAL, _EXT_UUID, _EXT_ITEM = 6, 7, 8, 9, 10

_ITEM_KINDS = ("item", "dataclass", "attrs")

_STORABLE = (
    "str, int, float, bool, None, bytes, list, tuple, dict, set, frozenset, datetime, "
    "date, time, timedelta, Decimal, UUID, scrapy.Item, dataclass and attrs instances"
)


_counts = [0, 0]
"""[extension values packed, StoredItems made]: encode and decode compare them before and
after (cheaper than a closure per call; another thread can only cause a false positive:
a plain envelope written as version 2, or a needless look for StoredItems)."""


class _Unstorable(TypeError):
    """Raised inside msgpack's ``default`` hook; turned into EncodeError with a path."""


def _tz_out(tz: Any) -> Any:
    if tz is None:
        return None
    if isinstance(tz, dt.timezone):
        args = tz.__getinitargs__()  # type: ignore[attr-defined]
        offset = args[0]
        return [(offset.days * 86400 + offset.seconds) * 1_000_000 + offset.microseconds,
                args[1] if len(args) > 1 else None]
    key = getattr(tz, "key", None)
    if isinstance(tz, zoneinfo.ZoneInfo) and isinstance(key, str):
        return key
    raise _Unstorable(
        f"time zone {tz!r} ({type(tz).__name__}) cannot be stored; use datetime.timezone "
        "or zoneinfo.ZoneInfo"
    )


def _tz_in(value: Any) -> dt.tzinfo | None:
    if value is None:
        return None
    if isinstance(value, str):
        return zoneinfo.ZoneInfo(value)
    offset, name = value
    delta = dt.timedelta(microseconds=offset)
    return dt.timezone(delta) if name is None else dt.timezone(delta, name)


def _item_path(obj: Any) -> str:
    cls = type(obj)
    path = f"{cls.__module__}:{cls.__qualname__}"
    if "<" in path or cls.__module__ == "__main__":
        raise _Unstorable(
            f"{cls.__qualname__} is defined in a function or in __main__, where a worker "
            "cannot find it; define the class at module level in your project"
        )
    return path


def _item_fields(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """(kind, fields) of an item instance the codec stores, else None."""
    cls = type(obj)
    if "__attrs_attrs__" in cls.__dict__ or hasattr(cls, "__attrs_attrs__"):
        return "attrs", {a.name: getattr(obj, a.name) for a in cls.__attrs_attrs__}
    if dataclasses.is_dataclass(cls):
        return "dataclass", {f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)}
    scrapy_mod = sys.modules.get("scrapy")
    if scrapy_mod is not None and isinstance(obj, scrapy_mod.Item):
        return "item", dict(obj.items())
    return None


def _default(obj: Any) -> Any:  # noqa: C901 (one branch per tagged msgpack type, in one place)
    """msgpack's hook for everything that is not exactly str/int/float/bool/None/bytes/
    list/dict: extension types, and subclasses of the plain types as the plain type."""
    t = type(obj)
    if t is tuple or t is set or t is frozenset:
        _counts[0] += 1
        code = _EXT_TUPLE if t is tuple else _EXT_SET if t is set else _EXT_FROZENSET
        return msgpack.ExtType(code, _pack(list(obj)))
    if isinstance(obj, dt.datetime):
        _counts[0] += 1
        naive = obj.replace(tzinfo=None, fold=0).isoformat()
        return msgpack.ExtType(_EXT_DATETIME, _pack([naive, obj.fold, _tz_out(obj.tzinfo)]))
    if isinstance(obj, dt.date):
        _counts[0] += 1
        return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
    if isinstance(obj, dt.time):
        _counts[0] += 1
        naive = obj.replace(tzinfo=None, fold=0).isoformat()
        return msgpack.ExtType(_EXT_TIME, _pack([naive, obj.fold, _tz_out(obj.tzinfo)]))
    if isinstance(obj, dt.timedelta):
        _counts[0] += 1
        return msgpack.ExtType(_EXT_TIMEDELTA,
                               _pack([obj.days, obj.seconds, obj.microseconds]))
    if isinstance(obj, decimal.Decimal):
        _counts[0] += 1
        return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, uuid.UUID):
        _counts[0] += 1
        return msgpack.ExtType(_EXT_UUID, obj.bytes)
    if isinstance(obj, StoredItem):
        _counts[0] += 1
        return msgpack.ExtType(_EXT_ITEM, _pack([obj.path, obj.kind, obj.fields]))
    # subclasses of plain types, stored as the plain type (OrderedDict, IntEnum, ...)
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    if isinstance(obj, tuple):  # namedtuple: a tuple
        _counts[0] += 1
        return msgpack.ExtType(_EXT_TUPLE, _pack(list(obj)))
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, float):
        return float.__float__(obj)
    if isinstance(obj, bytes):
        return bytes.__bytes__(obj)
    item = _item_fields(obj)
    if item is not None:
        _counts[0] += 1
        return msgpack.ExtType(_EXT_ITEM, _pack([_item_path(obj), item[0], item[1]]))
    raise _Unstorable(f"a {t.__name__} cannot be stored")


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, strict_types=True,  # type: ignore[no-any-return]
                         default=_default)


def _lookup_item_class(path: str, kind: str) -> type | None:
    """The class at ``path`` if a module this process has imported defines it and it is
    an item class of ``kind``; None if the module is not imported. Never imports, never
    runs a module's ``__getattr__``."""
    module_name, _, qualname = path.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        return None
    obj: Any = module
    for part in qualname.split("."):
        obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        if obj is None:
            raise DecodeError(f"stored item class {path!r} does not exist in this worker")
    if not isinstance(obj, type):
        raise DecodeError(f"stored item class {path!r} is not a class")
    if kind == "item":
        ok = issubclass(obj, sys.modules["scrapy"].Item) if "scrapy" in sys.modules else False
    elif kind == "dataclass":
        ok = dataclasses.is_dataclass(obj)
    else:
        ok = hasattr(obj, "__attrs_attrs__")
    if not ok:
        raise DecodeError(f"stored item class {path!r} is not a {kind} class; refused")
    return obj


def _build_item(cls: type, path: str, kind: str, fields: dict[str, Any]) -> Any:
    """An instance of ``cls`` holding ``fields``, made as pickle does (no ``__init__``)."""
    if kind == "item":
        declared = set(cast(Any, cls).fields)
    elif kind == "dataclass":
        declared = {f.name for f in dataclasses.fields(cast(Any, cls))}
    else:
        declared = {a.name for a in cast(Any, cls).__attrs_attrs__}
    unknown = set(fields) - declared
    if unknown:
        raise DecodeError(f"stored {path} has fields {sorted(map(str, unknown))} that the "
                          "class does not declare (the class changed since it was stored)")
    try:
        if kind == "item":
            item: Any = cast(Any, cls).__new__(cls)
            item._values = dict(fields)
            return item
        missing = declared - set(fields)
        if missing:
            raise DecodeError(f"stored {path} lacks fields {sorted(missing)} (the class "
                              "changed since it was stored)")
        obj: Any = object.__new__(cls)
        for name, value in fields.items():
            object.__setattr__(obj, name, value)
        return obj
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"cannot rebuild stored {path}: {exc}") from None


def _item_in(data: bytes) -> Any:
    value = _unpack(data)
    if (not isinstance(value, list) or len(value) != 3 or not isinstance(value[0], str)
            or value[1] not in _ITEM_KINDS or not isinstance(value[2], dict)
            or not all(isinstance(k, str) for k in value[2])):
        raise DecodeError("stored item is malformed: want [class path, kind, {field: value}]")
    path, kind, fields = value
    cls = _lookup_item_class(path, kind)
    if cls is None:
        _counts[1] += 1
        return StoredItem(path, kind, fields)
    return _build_item(cls, path, kind, fields)


def _datetime_in(data: bytes, time_only: bool) -> Any:
    naive, fold, tz = _unpack(data)
    parse = dt.time.fromisoformat if time_only else dt.datetime.fromisoformat
    value = parse(naive)
    if value.tzinfo is not None:
        raise DecodeError("stored time has an offset in its ISO text")
    return value.replace(tzinfo=_tz_in(tz), fold=fold)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_TUPLE:
        return tuple(_unpack(data))
    if code == _EXT_SET:
        return set(_unpack(data))
    if code == _EXT_FROZENSET:
        return frozenset(_unpack(data))
    if code == _EXT_DATETIME:
        return _datetime_in(data, time_only=False)
    if code == _EXT_DATE:
        return dt.date.fromisoformat(data.decode())
    if code == _EXT_TIME:
        return _datetime_in(data, time_only=True)
    if code == _EXT_TIMEDELTA:
        days, seconds, micros = _unpack(data)
        return dt.timedelta(days=days, seconds=seconds, microseconds=micros)
    if code == _EXT_DECIMAL:
        return decimal.Decimal(data.decode())
    if code == _EXT_UUID:
        return uuid.UUID(bytes=data)
    if code == _EXT_ITEM:
        return _item_in(data)
    raise DecodeError(f"unknown extension type {code} (written by a newer redcrawl?)")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def _problem(value: Any, path: str, depth: int = 0) -> str | None:  # noqa: C901 (one branch per storable type, to name the bad value)
    """Why ``value`` (at ``path``) cannot be stored, or None: the slow walk run only
    after msgpack refused something, to name the key."""
    if depth > MAX_DEPTH:
        return f"{path} is nested more than {MAX_DEPTH} levels deep; flatten it"
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            return f"{path} = {value} does not fit in 64 bits; store it as a string"
        return None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{path} is not valid text ({exc}); store it as bytes"
        return None
    if isinstance(value, float | bytes | dt.date | dt.timedelta | decimal.Decimal
                  | uuid.UUID):
        if isinstance(value, dt.datetime | dt.time):
            try:
                _tz_out(value.tzinfo)
            except _Unstorable as exc:
                return f"{path}: {exc}"
        return None
    if isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            problem = _problem(item, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            problem = _problem(k, f"{path} key {k!r}", depth + 1) or _problem(
                item, f"{path}[{k!r}]", depth + 1)
            if problem:
                return problem
        return None
    try:
        fields = value.fields if isinstance(value, StoredItem) else None
        if fields is None:
            item = _item_fields(value)
            if item is not None:
                _item_path(value)
                fields = item[1]
    except _Unstorable as exc:
        return f"{path}: {exc}"
    if fields is not None:
        for name, item_value in fields.items():
            problem = _problem(item_value, f"{path}.{name}", depth + 1)
            if problem:
                return problem
        return None
    return (f"{path} holds a value of type {type(value).__name__}, which cannot be stored "
            f"in Redis; keep "
            f"to {_STORABLE} (or remove the key before the request is scheduled)")


def encode(env: Envelope, *, fingerprint: bool = True) -> bytes:  # noqa: C901 (one branch per optional envelope field: the hot path, flat)
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
    d: dict[str, Any] = {"v": PLAIN_VERSION, "u": env.url}
    if env.method != "GET":
        d["m"] = env.method
    if env.headers:
        d["h"] = [[k, list(v)] for k, v in env.headers]
    if env.body:
        d["b"] = bytes(env.body)
    if env.cookies:
        d["c"] = env.cookies
    if env.meta:
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
        if not all(type(k) is str for k in env.cb_kwargs):
            raise EncodeError(f"request {env.url}: cb_kwargs keys must be strings (they are "
                              f"keyword arguments), got {list(env.cb_kwargs)!r}")
        d["k"] = env.cb_kwargs
    if env.encoding != "utf-8":
        d["e"] = env.encoding
    if env.request_class:
        d["cls"] = env.request_class
    if env.extra:
        d["x"] = env.extra
    if fingerprint and env.fingerprint is not None and not env.dont_filter:
        d["f"] = env.fingerprint
    before = _counts[0]
    try:
        data: bytes = packb(d, use_bin_type=True, strict_types=True, default=_default)
        if _counts[0] != before:  # an extension type inside: only version 2 readers can read it
            if data[1:4] == b"\xa1v\x01":  # fixmap, then "v": 1 (encode's first key)
                data = b"%c\xa1v\x02%s" % (data[0], data[4:])
            else:
                d["v"] = FORMAT_VERSION
                data = _pack(d)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        for name, key in (("cookies", "c"), ("meta", "mt"), ("cb_kwargs", "k"),
                          ("request attributes", "x")):
            problem = _problem(d[key], name) if key in d else None
            if problem:
                raise EncodeError(problem) from None  # starts with the key (the API relies on it)
        raise EncodeError(f"request {env.url} cannot be encoded: {exc}") from None
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
    before = _counts[1]
    try:
        d = unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises a variety of ValueError subclasses
        raise DecodeError(f"envelope is not valid msgpack ({exc.__class__.__name__}: {exc})")
    if not isinstance(d, dict):
        raise DecodeError(f"envelope is a {type(d).__name__}, not a map")
    version = d.get("v")
    if type(version) is not int or version not in READ_VERSIONS:
        raise DecodeError(
            f"envelope format version {version!r} is not supported by this redcrawl "
            f"(reads versions {sorted(READ_VERSIONS)}); upgrade the workers or requeue the "
            "request"
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
    if "cb_kwargs" in kwargs and not all(type(k) is str for k in kwargs["cb_kwargs"]):
        raise DecodeError("envelope cb_kwargs has a key that is not a string")
    if "flags" in kwargs and not all(isinstance(f, str) for f in kwargs["flags"]):
        raise DecodeError("envelope flags are not all strings")
    return Envelope(url=url, unresolved=_counts[1] != before, **kwargs)


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
            candidates = [fname]
            if fname.startswith("__") and not fname.endswith("__"):  # name-mangled private
                candidates += [f"_{c.__name__.lstrip('_')}{fname}" for c in type(spider).__mro__]
            for candidate in candidates:
                found = getattr(spider, candidate, None)
                if getattr(found, "__func__", None) is target:
                    name = str(candidate)
                    break
            else:
                for member_name, member in inspect.getmembers(spider,
                                                              predicate=inspect.ismethod):
                    if member.__func__ is target:
                        name = str(member_name)
                        break
    if name is None:
        raise EncodeError(
            f"request {url}: {what} {func!r} is not a method of the spider. Callbacks "
            "must be spider methods, not lambdas or module functions, so a worker can "
            "look them up by name"
        )
    problem = callback_problem(spider, name) if spider is not None else None
    if problem is not None:
        raise EncodeError(f"request {url}: {what} {problem}. A stored request may only name "
                          "a public method of your spider's own class")
    return name


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
    problem = callback_problem(spider, name)
    if problem is not None:
        raise DecodeError(f"{what} {problem}; refused (spider {spider.name!r})")
    fn = getattr(spider, name, None)
    if not inspect.ismethod(fn) or fn.__self__ is not spider:
        raise DecodeError(f"{what} {name!r} is not a method of spider {spider.name!r}")
    return fn


def _resolve_items(value: Any, depth: int = 0) -> Any:
    """``value`` with every :class:`StoredItem` replaced by its instance (DecodeError
    naming the class when this worker has not imported it)."""
    if isinstance(value, StoredItem):
        cls = _lookup_item_class(value.path, value.kind)
        if cls is None:
            module = value.path.partition(":")[0]
            raise DecodeError(
                f"meta holds a {value.path} item, but this worker has not imported module "
                f"{module!r}; import it in the spider's module (classes are never imported "
                "because of stored data)"
            )
        return _build_item(cls, value.path, value.kind, _resolve_items(value.fields, depth))
    if depth > MAX_DEPTH:
        raise DecodeError("stored value is nested too deep")
    if isinstance(value, dict):
        return {_resolve_items(k, depth + 1): _resolve_items(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(_resolve_items(v, depth + 1) for v in value)
    return value


def to_request(env: Envelope, spider: scrapy.Spider | None = None) -> scrapy.Request:  # noqa: C901 (one branch per optional Request argument: the hot path, flat)
    """Envelope -> Scrapy request, callbacks resolved on ``spider`` (without a spider the
    request has no callback, so Scrapy uses the spider's default ``parse``). Whatever the
    envelope holds, the only error is :class:`DecodeError`."""
    import scrapy

    try:
        if env.unresolved:
            env.meta = _resolve_items(env.meta)
            env.cb_kwargs = _resolve_items(env.cb_kwargs)
            env.unresolved = False
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
    except DecodeError:
        raise
    except Exception as exc:  # whatever a corrupt envelope makes Scrapy raise
        raise DecodeError(f"cannot rebuild request {env.url!r}: {exc.__class__.__name__}: "
                          f"{exc}") from None


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
