"""The tagged msgpack extension types of envelope format version 2: tuple, set, frozenset,
datetime, date, time, timedelta, Decimal, UUID and items (scrapy.Item, dataclass, attrs).

The codes and payloads are in the wire-format table at the top of :mod:`redcrawl.codec`.
:func:`pack_default` is msgpack's ``default`` hook on the way out, :func:`ext_hook` its
``ext_hook`` on the way back; :func:`storage_problem` names the value msgpack refused.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import sys
import uuid
import zoneinfo
from dataclasses import dataclass
from typing import Any, cast

import msgpack

from redcrawl.errors import DecodeError

MAX_DEPTH = 500
"""Nesting depth reported when msgpack refuses a structure as too deep (its own limit is
about 1,000 levels of lists and maps, fewer of tuples and sets)."""


@dataclass(slots=True, frozen=True, eq=False)
class StoredItem:
    """An item read from an envelope whose class the reading process has not imported
    (e.g. ``redcrawl dead`` or the API showing a request). Encodes back unchanged."""

    path: str
    kind: str
    fields: dict[str, Any]


_EXT_TUPLE, _EXT_SET, _EXT_FROZENSET, _EXT_DATETIME, _EXT_DATE = 1, 2, 3, 4, 5
_EXT_TIME, _EXT_TIMEDELTA, _EXT_DECIMAL, _EXT_UUID, _EXT_ITEM = 6, 7, 8, 9, 10

_ITEM_KINDS = ("item", "dataclass", "attrs")

_STORABLE = (
    "str, int, float, bool, None, bytes, list, tuple, dict, set, frozenset, datetime, "
    "date, time, timedelta, Decimal, UUID, scrapy.Item, dataclass and attrs instances"
)


ext_counts = [0, 0]
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
        return [
            (offset.days * 86400 + offset.seconds) * 1_000_000 + offset.microseconds,
            args[1] if len(args) > 1 else None,
        ]
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


def pack_default(obj: Any) -> Any:  # noqa: C901 (one branch per tagged msgpack type, in one place)
    """msgpack's hook for everything that is not exactly str/int/float/bool/None/bytes/
    list/dict: extension types, and subclasses of the plain types as the plain type."""
    t = type(obj)
    if t is tuple or t is set or t is frozenset:
        ext_counts[0] += 1
        code = _EXT_TUPLE if t is tuple else _EXT_SET if t is set else _EXT_FROZENSET
        return msgpack.ExtType(code, pack(list(obj)))
    if isinstance(obj, dt.datetime | dt.time):  # before date: a datetime is a date
        ext_counts[0] += 1
        naive = obj.replace(tzinfo=None, fold=0).isoformat()
        code = _EXT_DATETIME if isinstance(obj, dt.datetime) else _EXT_TIME
        return msgpack.ExtType(code, pack([naive, obj.fold, _tz_out(obj.tzinfo)]))
    if isinstance(obj, dt.date):
        ext_counts[0] += 1
        return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
    if isinstance(obj, dt.timedelta):
        ext_counts[0] += 1
        return msgpack.ExtType(_EXT_TIMEDELTA, pack([obj.days, obj.seconds, obj.microseconds]))
    if isinstance(obj, decimal.Decimal):
        ext_counts[0] += 1
        return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, uuid.UUID):
        ext_counts[0] += 1
        return msgpack.ExtType(_EXT_UUID, obj.bytes)
    if isinstance(obj, StoredItem):
        ext_counts[0] += 1
        return msgpack.ExtType(_EXT_ITEM, pack([obj.path, obj.kind, obj.fields]))
    # subclasses of plain types, stored as the plain type (OrderedDict, IntEnum, ...)
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    if isinstance(obj, tuple):  # namedtuple: a tuple
        ext_counts[0] += 1
        return msgpack.ExtType(_EXT_TUPLE, pack(list(obj)))
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
        ext_counts[0] += 1
        return msgpack.ExtType(_EXT_ITEM, pack([_item_path(obj), item[0], item[1]]))
    raise _Unstorable(f"a {t.__name__} cannot be stored")


def pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True, strict_types=True, default=pack_default)
    return packed


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
        raise DecodeError(
            f"stored {path} has fields {sorted(map(str, unknown))} that the "
            "class does not declare (the class changed since it was stored)"
        )
    try:
        if kind == "item":
            item: Any = cast(Any, cls).__new__(cls)
            item._values = dict(fields)
            return item
        missing = declared - set(fields)
        if missing:
            raise DecodeError(
                f"stored {path} lacks fields {sorted(missing)} (the class "
                "changed since it was stored)"
            )
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
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not isinstance(value[0], str)
        or value[1] not in _ITEM_KINDS
        or not isinstance(value[2], dict)
        or not all(isinstance(k, str) for k in value[2])
    ):
        raise DecodeError("stored item is malformed: want [class path, kind, {field: value}]")
    path, kind, fields = value
    cls = _lookup_item_class(path, kind)
    if cls is None:
        ext_counts[1] += 1
        return StoredItem(path, kind, fields)
    return _build_item(cls, path, kind, fields)


def _datetime_in(data: bytes, time_only: bool) -> Any:
    naive, fold, tz = _unpack(data)
    parse = dt.time.fromisoformat if time_only else dt.datetime.fromisoformat
    value = parse(naive)
    if value.tzinfo is not None:
        raise DecodeError("stored time has an offset in its ISO text")
    return value.replace(tzinfo=_tz_in(tz), fold=fold)


def ext_hook(code: int, data: bytes) -> Any:
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
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=ext_hook)


def storage_problem(value: Any, path: str, depth: int = 0) -> str | None:  # noqa: C901 (one branch per storable type, to name the bad value)
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
    if isinstance(value, float | bytes | dt.date | dt.timedelta | decimal.Decimal | uuid.UUID):
        if isinstance(value, dt.datetime | dt.time):
            try:
                _tz_out(value.tzinfo)
            except _Unstorable as exc:
                return f"{path}: {exc}"
        return None
    if isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            problem = storage_problem(item, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            problem = storage_problem(k, f"{path} key {k!r}", depth + 1) or storage_problem(
                item, f"{path}[{k!r}]", depth + 1
            )
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
            problem = storage_problem(item_value, f"{path}.{name}", depth + 1)
            if problem:
                return problem
        return None
    return (
        f"{path} holds a value of type {type(value).__name__}, which cannot be stored "
        f"in Redis; keep "
        f"to {_STORABLE} (or remove the key before the request is scheduled)"
    )


def resolve_items(value: Any, depth: int = 0) -> Any:
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
        return _build_item(cls, value.path, value.kind, resolve_items(value.fields, depth))
    if depth > MAX_DEPTH:
        raise DecodeError("stored value is nested too deep")
    if isinstance(value, dict):
        return {resolve_items(k, depth + 1): resolve_items(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(resolve_items(v, depth + 1) for v in value)
    return value
