"""The stored record of a request and the stored numbers of a crawl, as Python reads them
(the same rules as ``parse_head``, ``int_ok`` and ``layout_ok`` in ``lua/lib.lua``).

A request is stored once, in the crawl's request hash, as ``<priority>|<attempts>|<lease
token>|<msgpack envelope>`` (the token is empty unless the request is IN-FLIGHT). In a
crawl whose layout carries :data:`LEASE_STATE_OUT` the lease state is not in the record:
``<attempts>`` counts the deliveries that ended and ``<lease token>`` is a fence (see
:func:`holds_under`). In a crawl with politeness (lists layout ``<ordering>/<mode>``)
the envelope is preceded by the request's politeness key, ``K<length>:<key>``, computed
once at push so that Lua never parses URLs (``rec_key`` in ``lua/lib.lua``); an envelope
(a msgpack map) never starts with ``K``. A record stored by a push ends with its push
time: the byte 127 (DEL) and 7 base-64 digits (milliseconds, server clock; digit ``d``
is the byte ``48 + d``), for the latency histogram the ack step keeps
(``lua/latency.lua``); :func:`parse_record` strips it.
"""

from __future__ import annotations

import re

from redcrawl import codec
from redcrawl.codec import Envelope
from redcrawl.envelope import stored_bytes
from redcrawl.errors import DecodeError, FrontierError

__all__ = [
    "LEASE_STATE_OUT",
    "SLOT_MARK",
    "from_record",
    "holds_under",
    "layout_without_stamps",
    "lease_state_out",
    "parse_record",
    "push_time",
    "record",
    "record_holds_slot",
    "record_key",
    "stored_int",
    "stored_layout",
]


def record(env: Envelope, key: str | None = None, stamp: bytes = b"") -> bytes:
    """The stored form of a new request: the state header ``<priority>|<attempts>|<lease
    token>|``, its politeness ``key`` if given (``K<length>:<key>``), the encoded
    envelope (without the fingerprint, which is the id) and its push ``stamp`` if given
    (:func:`push_time`'s format), built in one piece."""
    body = stored_bytes(env)  # (encoded once: by the Scrapy scheduler at enqueue time)
    if key is None:
        return b"%d|0||%s%s" % (env.priority, body, stamp)
    k = key.encode()
    return b"%d|0||K%d:%s%s%s" % (env.priority, len(k), k, body, stamp)


_KEY_PREFIX = re.compile(rb"[Kk]([0-9]{1,6}):")
"""``K``: the request holds its key's slot (or is not in flight); ``k``: in flight, its
slot given back when its response arrived (``slot_free`` in ``lua/polite.lua``)."""


def _split_key(body: bytes) -> tuple[str | None, bytes]:
    if body[:1] not in (b"K", b"k"):  # (an envelope, a msgpack map, never starts so)
        return None, body
    m = _KEY_PREFIX.match(body)
    if m is None:
        return None, body
    end = m.end() + int(m.group(1))
    return body[m.end() : end].decode(errors="replace"), body[end:]


_STAMP = re.compile(rb"\x7f[0-o]{7}\Z")
"""The push-time suffix ``lua/latency.lua`` appends to a stored record."""


def push_time(data: bytes) -> float | None:
    """When a stored record was pushed (seconds since the epoch, server clock), or None
    if it has no push stamp (pushed before stamps existed, or a record not yet stored)."""
    m = _STAMP.match(data, max(0, len(data) - 8))
    if m is None:
        return None
    ms = 0
    for digit in m.group()[1:]:
        ms = ms * 64 + digit - 48
    return ms / 1000


def record_key(data: bytes) -> str | None:
    """The politeness key stored in a record (None: the crawl has no politeness)."""
    return _split_key(data.split(b"|", 3)[-1])[0]


def record_holds_slot(data: bytes) -> bool:
    """Whether a record with a politeness key still holds its key's slot: false once its
    response arrived (the slot went back then, before its ack)."""
    return data.split(b"|", 3)[-1][:1] == b"K"


_INTEGER = re.compile(rb"-?[0-9]{1,18}")
"""A counter or time as the scripts accept it (``int_ok`` in ``lua/lib.lua``)."""
_LAYOUT = re.compile(rb"[a-z][a-z/0-9]* [-0-9,]* [a-z]+[ A-Za-z0-9.+-]*")
"""A well-formed stored layout (``layout_ok`` in ``lua/lib.lua``)."""


def stored_int(raw: bytes | None) -> int | None:
    """A stored counter or time (None: missing, 0), or None if it is corrupt."""
    if raw is None:
        return 0
    return int(raw) if _INTEGER.fullmatch(raw) else None


PUSH_STAMPED = b" +pushtime"
"""The end of the stored layout of a crawl whose records carry their push time (``STAMPED``
in ``lua/lib.lua``): crawls created before keep their layout and get no stamps."""


LEASE_STATE_OUT = b" +leasestate"
"""In the stored layout of a crawl whose records keep no lease state (before
:data:`PUSH_STAMPED`; ``FMT.lout`` in ``lua/lib.lua``): a lease writes no record, the
header's attempts count the deliveries that ended (not the one in progress) and its token
field is a fence, not the holder's token (see :func:`holds_under`). Lists crawls created
since are so (with politeness since session 24, marked :data:`SLOT_MARK` too); crawls
created before keep the format they have."""


SLOT_MARK = b" +slotmark"
"""Before :data:`LEASE_STATE_OUT` in the stored layout of a lists crawl with politeness whose
records keep no lease state (a record's slot mark at rest is ``K``; the grant writes
nothing): workers before that format accepted ``+leasestate`` on any lists crawl but kept a
polite crawl's lease state in its records, and must refuse such a crawl."""


def layout_without_stamps(raw: bytes) -> bytes:
    """A stored layout without its :data:`PUSH_STAMPED`, :data:`LEASE_STATE_OUT` and
    :data:`SLOT_MARK` marks (the settings part alone)."""
    return raw.removesuffix(PUSH_STAMPED).removesuffix(LEASE_STATE_OUT).removesuffix(SLOT_MARK)


def lease_state_out(raw: bytes | None) -> bool:
    """Whether a crawl of this stored layout keeps the lease state out of its records."""
    return raw is not None and raw.removesuffix(PUSH_STAMPED).endswith(LEASE_STATE_OUT)


def holds_under(field: str, token: str, out: bool) -> bool:
    """Whether a record whose header token field is ``field`` may be IN-FLIGHT under the
    lease ``token`` (``FMT.holds`` in ``lua/lib.lua``): the holder's token itself, or with
    the lease state ``out`` of the record, a fence below the token (the lease's entry
    must list the request too)."""
    if not out:
        return field != "" and field == token
    if not token.isdigit():
        return False
    return field == "" or (field.isdigit() and int(field) < int(token))


def stored_layout(control: dict[bytes, bytes]) -> bytes | None:
    """The layout a crawl was created with, from its control hash (``layout``, or
    ``layout.copy`` if that one is corrupt); None for a new crawl. Raises
    :class:`FrontierError` when neither copy is readable."""
    first, copy = control.get(b"layout"), control.get(b"layout.copy")
    for raw in (first, copy):
        if raw is not None and _LAYOUT.fullmatch(raw):
            return raw
    if first is None and copy is None:
        return None
    raise FrontierError(
        f"crawl layout unreadable: the control hash holds layout {first!r} "
        f"and layout.copy {copy!r}; if you know the settings the crawl was "
        "created with, set both fields to the layout a worker with those "
        "settings uses, or purge the crawl"
    )


_HEAD = re.compile(rb"(-?[0-9]{1,15})\|([0-9]{1,15})\|([^|]*)\|(?:[Kk]([0-9]{1,6}):)?")
"""A record's state header, as ``parse_head`` in ``lua/lib.lua`` reads it: priority,
attempts (numbers of at most 15 digits: Lua would print anything past 2^53 as ``1e+20``),
lease token; then (here only, in the same match) the length of the politeness key that
follows, if there is one (as :data:`_KEY_PREFIX`; the key itself is not decoded)."""


def parse_record(data: bytes) -> tuple[int, int, str, bytes]:
    """(priority, attempts, lease token, envelope bytes) of a stored record."""
    m = _HEAD.match(data)
    try:
        if m is None:
            raise ValueError
        p, a, token, _ = m.groups()
        return int(p), int(a), token.decode(), _envelope_part(data, m)
    except (ValueError, UnicodeDecodeError):
        raise DecodeError("stored record has no state header") from None


def _envelope_part(data: bytes, head: re.Match[bytes]) -> bytes:
    """The envelope bytes of a record whose header (with its politeness key's length, if
    any) is ``head``: without the push stamp at its end and the key before it."""
    start, key_len = head.end(), head.group(4)
    if key_len is not None:
        start += int(key_len)
    # (the stamp matched at its place, and only past its first byte: a search would
    # try every position)
    if data[-8:-7] == b"\x7f" and _STAMP.match(data, len(data) - 8):
        return data[start:-8]
    return data[start:]


def from_record(data: bytes) -> Envelope:
    """The envelope of a stored record; :class:`DecodeError` if corrupt."""
    m = _HEAD.match(data)
    if m is None:
        raise DecodeError("stored record has no state header")
    token = m.group(3)
    if token and not token.isascii():  # (as parse_record: a token must be text)
        try:
            token.decode()
        except UnicodeDecodeError:
            raise DecodeError("stored record has no state header") from None
    return codec.decode(_envelope_part(data, m))
