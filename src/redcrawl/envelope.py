"""Envelope <-> bytes: the wire format of one stored request (table at the top of
:mod:`redcrawl.codec`). :func:`encode` leaves out fields at their default and writes
version 1 unless an extension type (:mod:`redcrawl.msgpack_types`) is inside;
:func:`decode` rejects anything corrupt or from a future version with DecodeError.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from msgpack import Packer, unpackb

from redcrawl.errors import DecodeError, EncodeError
from redcrawl.msgpack_types import ext_counts, ext_hook, pack, pack_default, storage_problem
from redcrawl.settings import PRIORITY_LIMIT

FORMAT_VERSION = 2
"""The newest envelope format this codec reads and writes (see the table above)."""
PLAIN_VERSION = 1
"""The version written when an envelope holds no extension type."""
READ_VERSIONS = frozenset({1, 2})
MAX_ENVELOPE_BYTES = 8 * 1024 * 1024


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
    stored: bytes | None = field(default=None, init=False, repr=False, compare=False)
    """Its bytes without the fingerprint, once :func:`encode_for_store` made them (the
    Scrapy scheduler, to fail at enqueue time), so that the frontier's record does not
    encode it again. Whoever sets it changes the envelope no more; a copy made with
    ``dataclasses.replace`` starts without it."""


_packers = threading.local()
_KEEP_PACKER_BELOW = 65536
"""A thread's packer is kept for its next encode only after an envelope this small."""
"""This thread's msgpack packer, as ``p`` (absent while it packs: a nested encode, from
project code that a value's packing runs, gets a new one). A packer resets itself after
each value, and after an error."""


def _new_packer() -> Packer:
    return Packer(use_bin_type=True, strict_types=True, default=pack_default)


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
            raise EncodeError(
                f"request {env.url}: cb_kwargs keys must be strings (they are "
                f"keyword arguments), got {list(env.cb_kwargs)!r}"
            )
        d["k"] = env.cb_kwargs
    if env.encoding != "utf-8":
        d["e"] = env.encoding
    if env.request_class:
        d["cls"] = env.request_class
    if env.extra:
        d["x"] = env.extra
    if fingerprint and env.fingerprint is not None and not env.dont_filter:
        d["f"] = env.fingerprint
    before = ext_counts[0]
    try:
        # a packer of this thread's own, taken while in use (msgpack's packb makes a new
        # one per call: a third of encoding a typical envelope)
        packer = _packers.__dict__.pop("p", None) or _new_packer()
        data: bytes = packer.pack(d)
        # kept for the next encode only after a small envelope: msgpack's buffer never
        # shrinks, and a large one (or a failed pack) would pin its size per thread
        if len(data) <= _KEEP_PACKER_BELOW:
            _packers.p = packer
        if ext_counts[0] != before:  # an extension type inside: only version 2 readers can read it
            if data[1:4] == b"\xa1v\x01":  # fixmap, then "v": 1 (encode's first key)
                data = b"%c\xa1v\x02%s" % (data[0], data[4:])
            else:
                d["v"] = FORMAT_VERSION
                data = pack(d)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        for name, key in (
            ("cookies", "c"),
            ("meta", "mt"),
            ("cb_kwargs", "k"),
            ("request attributes", "x"),
        ):
            problem = storage_problem(d[key], name) if key in d else None
            if problem:
                raise EncodeError(problem) from None  # starts with the key (the API relies on it)
        raise EncodeError(f"request {env.url} cannot be encoded: {exc}") from None
    if len(data) > MAX_ENVELOPE_BYTES:
        raise EncodeError(
            f"request {env.url} encodes to {len(data)} bytes, over the "
            f"{MAX_ENVELOPE_BYTES}-byte limit; keep large payloads out of meta and body"
        )
    return data


def encode_for_store(env: Envelope) -> bytes:
    """:func:`encode` without the fingerprint (the form the frontier stores), kept on the
    envelope (:attr:`Envelope.stored`) for the frontier's record: for a caller that
    encodes to fail early and will not change the envelope before it is pushed."""
    data = encode(env, fingerprint=False)
    env.stored = data
    return data


def stored_bytes(env: Envelope) -> bytes:
    """The bytes the frontier stores for ``env``: those :func:`encode_for_store` kept,
    else :func:`encode` without the fingerprint."""
    data = env.stored
    return data if data is not None else encode(env, fingerprint=False)


def blank(url: str) -> Envelope:
    """``Envelope(url=url)``, built without the dataclass constructor's keyword handling
    (a third of decoding a typical envelope): for :func:`decode` and
    :func:`~redcrawl.codec.from_request`, which set the other fields themselves. Every
    field is set here, at its default (a test compares it with ``Envelope(url=url)``)."""
    env = _new(Envelope)
    env.url = url
    env.method = "GET"
    env.headers = []
    env.body = b""
    env.cookies = None
    env.meta = {}
    env.callback = None
    env.errback = None
    env.priority = 0
    env.flags = []
    env.dont_filter = False
    env.cb_kwargs = {}
    env.encoding = "utf-8"
    env.request_class = None
    env.extra = {}
    env.fingerprint = None
    env.unresolved = False
    env.stored = None
    return env


_new = object.__new__


def _setter(name: str) -> Any:
    return Envelope.__dict__[name].__set__  # (the slot's own setter)


# short key -> (setter of the Envelope attribute, required type or None for "any")
_FIELDS: dict[str, tuple[Any, type | tuple[type, ...] | None]] = {
    key: (_setter(attr), kind)
    for key, (attr, kind) in {
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
    }.items()
}


def decode(data: bytes) -> Envelope:
    """Bytes -> Envelope. Raises :class:`DecodeError` for corrupt or future envelopes."""
    before = ext_counts[1]
    try:
        d = unpackb(data, raw=False, strict_map_key=False, ext_hook=ext_hook)
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises a variety of ValueError subclasses
        raise DecodeError(f"envelope is not valid msgpack ({exc.__class__.__name__}: {exc})")
    if type(d) is not dict:  # (msgpack makes plain dicts)
        raise DecodeError(f"envelope is a {type(d).__name__}, not a map")
    version = d.get("v")
    if type(version) is not int or version not in READ_VERSIONS:
        raise DecodeError(
            f"envelope format version {version!r} is not supported by this redcrawl "
            f"(reads versions {sorted(READ_VERSIONS)}); upgrade the workers or requeue the "
            "request"
        )
    url = d.get("u")
    if type(url) is not str or not url:
        raise DecodeError("envelope has no URL")
    env = blank(url)
    fields = _FIELDS
    for key, value in d.items():
        spec = fields.get(key)
        if spec is None:
            continue  # "v", "u", or a field this version does not know: ignored
        setter, kind = spec
        if (kind is not None and not isinstance(value, kind)) or (
            kind is int and type(value) is bool
        ):
            raise DecodeError(f"envelope field {key!r} has type {type(value).__name__}")
        setter(env, value)
    if "h" in d:
        env.headers = _decode_headers(env.headers)
    if "k" in d and not all(type(k) is str for k in env.cb_kwargs):
        raise DecodeError("envelope cb_kwargs has a key that is not a string")
    if "fl" in d and not all(isinstance(f, str) for f in env.flags):
        raise DecodeError("envelope flags are not all strings")
    if ext_counts[1] != before:
        env.unresolved = True
    return env


def _decode_headers(headers: list[Any]) -> list[tuple[bytes, list[bytes]]]:
    out: list[tuple[bytes, list[bytes]]] = []
    for item in headers:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], bytes)
            or not isinstance(item[1], list)
            or not all(isinstance(x, bytes) for x in item[1])
        ):
            raise DecodeError(
                "envelope headers are malformed: want [[name, [values]], ...] of bytes"
            )
        out.append((item[0], item[1]))
    return out
