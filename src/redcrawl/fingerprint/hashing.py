"""The two request fingerprints: Scrapy's default fingerprint (``mode="scrapy"``) and
scrapy-redis 0.9.1's (``mode="scrapy-redis"``), 20 bytes each, computed without building a
:class:`scrapy.Request` where a URL is given.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from json.encoder import encode_basestring_ascii as _json_string
from typing import TYPE_CHECKING, Any, Literal

from redcrawl.fingerprint.canonical import Canonicalizer, _canonical_url

if TYPE_CHECKING:
    from scrapy import Request

FingerprintMode = Literal["scrapy", "scrapy-redis"]
"""``scrapy``: Scrapy's default request fingerprint; ``scrapy-redis``: scrapy-redis's."""


FINGERPRINT_SIZE = 20
"""Length in bytes of every fingerprint (a SHA-1 digest)."""

# Mapping is invariant in its key type: spell out str and bytes keys so that a plain
# dict[str, ...] type-checks as well as a mixed one.
_HeadersArg = (
    Mapping[str, Iterable[bytes | str]]
    | Mapping[bytes, Iterable[bytes | str]]
    | Mapping[bytes | str, Iterable[bytes | str]]
)
"""Request headers: a value is one str/bytes or an iterable of them (as scrapy.Headers)."""


# ------------------------------------------------------------------------- fingerprints


def _digest(
    url: str, method: str, body: bytes, headers_json: str | None, version: str | None
) -> bytes:
    """SHA-1 of the JSON Scrapy builds (keys sorted), optionally with a "version" key.
    ``headers_json=None`` leaves the "headers" member out, as scrapy-redis does."""
    headers = "" if headers_json is None else f', "headers": {headers_json}'
    tail = "}" if version is None else f', "version": {_json_string(version)}}}'
    # (one string built at once: a chain of + copies the growing text at each step)
    data = (
        f'{{"body": "{body.hex()}"{headers}, "method": {_json_string(method)}, '
        f'"url": {_json_string(url)}{tail}'
    )
    return hashlib.sha1(data.encode("ascii"), usedforsecurity=False).digest()


def _header_bytes(value: Any) -> bytes:
    """What ``scrapy.http.Headers`` stores for one key or value (utf-8)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int):
        return str(value).encode("utf-8")
    raise TypeError(f"Unsupported header type: {type(value)}")


def _header_values(value: Any) -> list[bytes]:
    """``scrapy.http.Headers.normvalue``: one value or an iterable of them."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        return [_header_bytes(value)]
    if hasattr(value, "__iter__"):
        return [_header_bytes(item) for item in value]
    return [_header_bytes(value)]


def _headers_json(
    headers: _HeadersArg | None,
    include_headers: Iterable[bytes | str],
) -> str:
    """The ``"headers"`` member of Scrapy's fingerprint JSON."""
    if not include_headers:
        return "{}"
    wanted = [
        name.lower() if isinstance(name, bytes) else name.lower().encode("utf-8")
        for name in sorted(include_headers)
    ]
    if not wanted or not headers:
        return "{}"
    # scrapy.http.Headers: keys are title-cased, values of equal keys are concatenated.
    stored: dict[bytes, list[bytes]] = {}
    for key, value in headers.items():
        stored.setdefault(_header_bytes(key.title()), []).extend(_header_values(value))
    selected: dict[str, list[str]] = {}
    for name in wanted:
        values = stored.get(name.title())
        if values is not None:
            selected[name.hex()] = [item.hex() for item in values]
    return json.dumps(selected, sort_keys=True) if selected else "{}"


def fingerprint(
    url: str,
    method: str = "GET",
    body: bytes = b"",
    headers: _HeadersArg | None = None,
    *,
    include_headers: Iterable[bytes | str] = (),
    keep_fragments: bool = False,
    canonicalizer: Canonicalizer | None = None,
    version: str | None = None,
    mode: FingerprintMode = "scrapy",
) -> bytes:
    """Return the 20-byte fingerprint of a request.

    With ``canonicalizer=None`` and ``version=None`` the result is byte-identical to
    ``scrapy.utils.request.fingerprint(Request(url, method=method, body=body,
    headers=headers), include_headers=include_headers, keep_fragments=keep_fragments)``.
    Headers count only when named in *include_headers* (case-insensitively); a named
    header the request lacks is skipped.

    With a *canonicalizer*, the URL is first rewritten by
    :meth:`Canonicalizer.canonicalize`. With a *version*, the version joins the hashed
    data, so the same request under another version gets another fingerprint.

    With ``mode="scrapy-redis"`` the result is byte-identical to scrapy-redis 0.9.1's
    ``RFPDupeFilter().request_fingerprint(Request(url, method=method, body=body))`` as
    raw bytes (scrapy-redis stores its hex form); scrapy-redis hashes no header and drops
    fragments, so *include_headers* and *keep_fragments* are refused with
    :class:`ValueError` in that mode.

    A URL w3lib cannot parse (e.g. a port out of range) raises :class:`ValueError`, as
    building the Scrapy request would. Unlike ``scrapy.Request``, a URL without a scheme
    is not rejected.
    """
    if canonicalizer is not None:
        url = canonicalizer.canonicalize(url)
    if mode == "scrapy-redis":
        if include_headers or keep_fragments:
            raise ValueError("scrapy-redis fingerprints include no header and no fragment")
        headers_json = None
    else:
        headers_json = _headers_json(headers, include_headers)
    return _digest(
        _canonical_url(url, keep_fragments),
        str(method).upper(),
        body or b"",
        headers_json,
        version,
    )


_NO_SLOT: Any = object()


def request_fingerprint(
    request: Request,
    *,
    canonicalizer: Canonicalizer | None = None,
    version_meta_key: str | None = None,
    mode: FingerprintMode = "scrapy",
) -> bytes:
    """Return the fingerprint of a :class:`scrapy.Request` (its URL, method and body).

    Without options this equals ``scrapy.utils.request.fingerprint(request)``, including
    Scrapy's ``verbatim_url`` meta key (the URL is hashed as is, and the canonicalizer is
    not applied either). With *version_meta_key*, ``request.meta[version_meta_key]``
    (stringified) is the version, when the key is present and its value is not ``None``.

    With ``mode="scrapy-redis"`` it equals scrapy-redis 0.9.1's
    ``RFPDupeFilter.request_fingerprint(request)`` (as bytes), which always canonicalises
    the URL (``verbatim_url`` is not honoured there).
    """
    # (the meta dict from its slot: Scrapy creates an empty one on first access to the
    # public property, which costs as much as hashing; None means no meta)
    meta = getattr(request, "_meta", _NO_SLOT)
    if meta is _NO_SLOT:
        meta = request.meta
    version: str | None = None
    if version_meta_key is not None and meta:
        value = meta.get(version_meta_key)
        if value is not None:
            version = value if isinstance(value, str) else str(value)
    url = request.url
    if mode == "scrapy-redis" or not (meta and meta.get("verbatim_url")):
        if canonicalizer is not None:
            url = canonicalizer.canonicalize(url)
        url = _canonical_url(url, False)
    headers_json = None if mode == "scrapy-redis" else "{}"
    return _digest(url, request.method, request.body or b"", headers_json, version)
