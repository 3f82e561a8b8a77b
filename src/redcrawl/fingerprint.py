"""Scrapy-compatible request fingerprints, plus opt-in URL canonicalisation.

:func:`fingerprint` returns the same 20 bytes as Scrapy's default request fingerprinter
(``scrapy.utils.request.fingerprint``, the 2.7+ implementation) without building a
:class:`scrapy.Request`: the SHA-1 of ::

    json.dumps({"method": ..., "url": canonicalize_url(safe_url_string(url)),
                "body": body.hex(), "headers": {...}}, sort_keys=True)

Canonicalising a URL with w3lib costs more than the rest of the fingerprint put together,
so URLs in a common, plain shape (lower-case ``http``/``https``, ASCII host, no
percent-escapes, no dot segments, a query of plain ``name=value`` pairs) take a fast path
that builds w3lib's canonical form directly; everything else goes through
``w3lib.url.canonicalize_url(w3lib.url.safe_url_string(url))``, exactly as Scrapy does.

A crawl migrated from scrapy-redis uses scrapy-redis's fingerprint instead (mode
``"scrapy-redis"``, fixed when the crawl is created, see :func:`fingerprinter_for`):
scrapy-redis 0.9.1's ``RFPDupeFilter.request_fingerprint`` hashes the same JSON without
its ``"headers"`` member, ``{"body": ..., "method": ..., "url": canonicalize_url(url)}``,
so the two modes never agree on a request, although they deduplicate exactly the same
requests (Scrapy's default fingerprinter includes no header either).

Two opt-in extensions change the fingerprint, and are off by default:

* a :class:`Canonicalizer` rewrites the URL first (drops tracking parameters such as
  ``utm_*``, strips default ports, ...), so URLs that differ only in such details share a
  fingerprint;
* a ``version`` string (per-request content versioning) joins the hashed data, so the same
  URL can be fetched again under a new version.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_string
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast
from urllib.parse import quote_plus

from w3lib.url import canonicalize_url, parse_qsl_to_bytes, safe_url_string

from redcrawl.errors import ConfigError, FrontierError
from redcrawl.settings import Settings

if TYPE_CHECKING:
    from scrapy import Request

    from redcrawl.keys import CrawlKeys

__all__ = [
    "DEFAULT_TRACKING_PARAMS",
    "FINGERPRINT_SIZE",
    "MODE_FIELD",
    "Canonicalizer",
    "FingerprintMode",
    "Fingerprinter",
    "canonicalizer_for",
    "crawl_fingerprint_mode",
    "fingerprint",
    "fingerprinter_for",
    "request_fingerprint",
]

FingerprintMode = Literal["scrapy", "scrapy-redis"]
"""``scrapy``: Scrapy's default request fingerprint; ``scrapy-redis``: scrapy-redis's."""

MODE_FIELD = "fingerprinter"
"""Field of the crawl's control hash holding its :data:`FingerprintMode`."""


FINGERPRINT_SIZE = 20
"""Length in bytes of every fingerprint (a SHA-1 digest)."""

DROP_PARAMS_SETTING = "REDCRAWL_CANONICAL_DROP_PARAMS"
"""The setting named in the :class:`~redcrawl.errors.ConfigError` for a bad pattern."""

DEFAULT_TRACKING_PARAMS: tuple[str, ...] = (
    "utm_*",
    "spm",
    "gclid",
    "gclsrc",
    "dclid",
    "gbraid",
    "wbraid",
    "fbclid",
    "yclid",
    "msclkid",
    "twclid",
    "ttclid",
    "igshid",
    "mc_cid",
    "mc_eid",
    "_hsenc",
    "_hsmi",
    "mkt_tok",
    "ref_src",
    "_openstat",
)
"""Query parameters (glob patterns, case-insensitive) that only track clicks or campaigns."""

# --------------------------------------------------------------------------- fast path

# A URL in this shape is already "safe" for w3lib.url.safe_url_string (every character is
# kept as is) and canonicalize_url only lower-cases the host, sorts the query, drops the
# fragment and turns an empty path into "/":
# * host: ASCII letters, digits, ".", "-", "_" (IDNA leaves ASCII alone);
# * port: 1-4 digits without a leading zero (so str(int(port)) == port);
# * path: RFC 3986 pchar without "%" (no escapes to normalise) and without ";" (path
#   parameters); "/." is rejected in code (dot segments);
# * query: unreserved characters, "+", "=" and "&" (parse/re-encode is the identity; a
#   second "=" in a value would become %3D and is rejected in code);
# * fragment: characters safe_url_string keeps as is.
_SIMPLE_URL_RE = re.compile(
    r"(https?)://"
    r"([A-Za-z0-9._\-]+)"
    r"(?::([1-9][0-9]{0,4}))?"
    r"(/[A-Za-z0-9\-._~!$&'()*+,=:@/]*)?"
    r"(?:\?([A-Za-z0-9\-._~+=&]*))?"
    r"(?:#([A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*))?"
)

# Mapping is invariant in its key type: spell out str and bytes keys so that a plain
# dict[str, ...] type-checks as well as a mixed one.
_HeadersArg = (
    Mapping[str, Iterable[bytes | str]]
    | Mapping[bytes, Iterable[bytes | str]]
    | Mapping[bytes | str, Iterable[bytes | str]]
)
"""Request headers: a value is one str/bytes or an iterable of them (as scrapy.Headers)."""

_SimpleURL = tuple[str, str, str | None, str, list[tuple[str, str]], str | None]


_Pair = TypeVar("_Pair", tuple[str, str], tuple[bytes, bytes])


def _split_simple(url: str) -> _SimpleURL | None:
    """Split a URL in the fast-path shape; ``None`` when it needs w3lib.

    Returns ``(scheme, host, port, path, pairs, fragment)`` with the host in its original
    case, the path non-empty and the query pairs in their original order. Each pair is
    already in the form w3lib's canonicalize_url encodes it to (a bare ``name`` becomes
    ``("name", "")``, empty fields are skipped).
    """
    match = _SIMPLE_URL_RE.fullmatch(url)
    if match is None:
        return None
    scheme, host, port, path, query, fragment = match.groups()
    if port is not None and int(port) > 65535:
        return None  # w3lib's path decides what such a URL means
    if path is None:
        path = "/"
    elif "/." in path:
        return None
    pairs: list[tuple[str, str]] = []
    if query:
        for item in query.split("&"):
            if item:
                name, _, value = item.partition("=")
                if "=" in value:
                    return None
                pairs.append((name, value))
    return scheme, host, port, path, pairs, fragment


def _canonical_url(url: str, keep_fragments: bool) -> str:
    """``canonicalize_url(safe_url_string(url), keep_fragments=...)``, what Scrapy hashes."""
    parts = _split_simple(url)
    if parts is None:
        return canonicalize_url(safe_url_string(url), keep_fragments=keep_fragments)
    scheme, host, port, path, pairs, fragment = parts
    # The pairs are sorted as encoded text, w3lib sorts them decoded: the only character
    # that decodes to something else is "+" -> " ", and both sort below every other
    # character allowed here, so the two orders agree.
    if len(pairs) > 1:
        pairs.sort()
    netloc = f"{host}:{port}" if port else host
    canonical = f"{scheme}://{netloc.lower()}{path}"
    if pairs:
        canonical += "?" + "&".join([f"{name}={value}" for name, value in pairs])
    if keep_fragments and fragment:
        canonical += "#" + fragment
    return canonical


# ------------------------------------------------------------------------- fingerprints


def _digest(url: str, method: str, body: bytes, headers_json: str | None,
            version: str | None) -> bytes:
    """SHA-1 of the JSON Scrapy builds (keys sorted), optionally with a "version" key.
    ``headers_json=None`` leaves the "headers" member out, as scrapy-redis does."""
    headers = "" if headers_json is None else ', "headers": ' + headers_json
    data = (
        '{"body": "'
        + body.hex()
        + '"'
        + headers
        + ', "method": '
        + _json_string(method)
        + ', "url": '
        + _json_string(url)
    )
    data += "}" if version is None else ', "version": ' + _json_string(version) + "}"
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
    meta = request.meta
    version: str | None = None
    if version_meta_key is not None:
        value = meta.get(version_meta_key)
        if value is not None:
            version = value if isinstance(value, str) else str(value)
    url = request.url
    if mode == "scrapy-redis" or not meta.get("verbatim_url"):
        if canonicalizer is not None:
            url = canonicalizer.canonicalize(url)
        url = _canonical_url(url, False)
    headers_json = None if mode == "scrapy-redis" else "{}"
    return _digest(url, request.method, request.body or b"", headers_json, version)


# ----------------------------------------------------------------------- canonicaliser

_PATTERN_RE = re.compile(r"[A-Za-z0-9_\-.*?\[\]]+")
_C0_CONTROL_OR_SPACE = "".join(chr(code) for code in range(0x21))
_TAB_OR_NEWLINE = str.maketrans("", "", "\t\n\r")


def _check_patterns(patterns: Iterable[str]) -> tuple[str, ...]:
    if isinstance(patterns, (str, bytes)):
        raise ConfigError(
            DROP_PARAMS_SETTING,
            f"expected a sequence of patterns, got the string {patterns!r} "
            "(use Canonicalizer.from_patterns() to split a comma-separated string)",
        )
    checked = tuple(patterns)
    for pattern in checked:
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(
                DROP_PARAMS_SETTING,
                f"empty or non-string query-parameter pattern {pattern!r} in {checked!r}",
            )
        if _PATTERN_RE.fullmatch(pattern) is None:
            raise ConfigError(
                DROP_PARAMS_SETTING,
                f"pattern {pattern!r} may only contain letters, digits and _ - . "
                "plus the glob characters * ? [ ]",
            )
    return checked


def _compile_patterns(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile(
        "|".join(f"(?:{fnmatch.translate(pattern)})" for pattern in patterns), re.IGNORECASE
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Canonicalizer:
    """An opt-in URL rewrite applied before fingerprinting.

    :meth:`canonicalize` first normalises the URL like ``w3lib.url.canonicalize_url``
    (percent-encoding, IDNA, dot segments, query encoding), then applies the options.
    Query parameters whose decoded name matches a *drop_params* glob pattern
    (case-insensitively) are removed; repeated parameters are kept.

    ``sort_query=False`` and ``drop_fragment=False`` only change :meth:`canonicalize`'s
    output: the fingerprint sorts the query and drops the fragment anyway (unless
    ``keep_fragments=True``). Likewise ``lowercase_host=False`` keeps the scheme and host
    as written in the output, but the fingerprint still lower-cases them.
    """

    drop_params: tuple[str, ...] = DEFAULT_TRACKING_PARAMS
    lowercase_host: bool = True
    strip_default_port: bool = True
    strip_www: bool = False
    drop_fragment: bool = True
    sort_query: bool = True
    strip_trailing_slash: bool = False
    remove_empty_params: bool = False
    _drop_re: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        patterns = _check_patterns(self.drop_params)
        object.__setattr__(self, "drop_params", patterns)
        object.__setattr__(self, "_drop_re", _compile_patterns(patterns))

    @classmethod
    def from_patterns(cls, patterns: str | Iterable[str], **kw: Any) -> Canonicalizer:
        """Build a canonicalizer dropping *patterns* (a comma-separated string or an
        iterable of glob patterns; surrounding whitespace is ignored).

        Raises :class:`~redcrawl.errors.ConfigError` naming
        ``REDCRAWL_CANONICAL_DROP_PARAMS`` for an empty pattern (e.g. ``"a,,b"``, ``""``)
        or a pattern with characters other than letters, digits, ``_-.`` and ``*?[]``.
        """
        if isinstance(patterns, str):
            items = patterns.split(",")
        elif isinstance(patterns, bytes):
            raise ConfigError(DROP_PARAMS_SETTING, f"expected str patterns, got {patterns!r}")
        else:
            items = list(patterns)
        stripped = [item.strip() if isinstance(item, str) else item for item in items]
        return cls(drop_params=tuple(stripped), **kw)

    def canonicalize(self, url: str) -> str:
        """Return the canonical form of *url*.

        Never raises for a bad URL: one that w3lib cannot parse is returned unchanged.
        """
        parts = _split_simple(url)
        if parts is None:
            return self._canonicalize_w3lib(url)
        scheme, host, port, path, pairs, fragment = parts
        # No "%" on this path, so "+" is the only encoded character in a name.
        pairs = self._kept(pairs, lambda name: name.replace("+", " "))
        if self.sort_query and len(pairs) > 1:
            pairs.sort()  # same order as sorting decoded, see _canonical_url
        query = "&".join([f"{name}={value}" for name, value in pairs])
        netloc = f"{host}:{port}" if port else host
        if self.lowercase_host:
            netloc = netloc.lower()
        netloc = self._rewrite_hostport(scheme, netloc)
        if self.strip_trailing_slash and len(path) > 1:
            path = path.rstrip("/") or "/"
        fragment = None if self.drop_fragment else fragment
        return _join(f"{scheme}://{netloc}{path}", query, fragment)

    def _kept(self, pairs: list[_Pair], decoded: Callable[[Any], str]) -> list[_Pair]:
        """The query pairs left after dropping tracking and (optionally) empty ones;
        ``decoded`` gives a name as the drop patterns see it."""
        drop_re = self._drop_re
        if drop_re is None and not self.remove_empty_params:
            return pairs
        return [(name, value) for name, value in pairs
                if not (self.remove_empty_params and not value)
                and (drop_re is None or drop_re.match(decoded(name)) is None)]

    def _canonicalize_w3lib(self, url: str) -> str:
        try:
            safe = safe_url_string(url)
            base = canonicalize_url(safe, keep_fragments=not self.drop_fragment)
        except ValueError:  # includes UnicodeError
            return url
        head, _, fragment = base.partition("#")
        head = head.partition("?")[0]
        # The query of the safe URL still has the original parameter order (the one in
        # `base` is sorted). Parsing and re-encoding it is what canonicalize_url does.
        raw_query = safe.partition("#")[0].partition("?")[2]
        pairs = parse_qsl_to_bytes(raw_query, keep_blank_values=True) if raw_query else []
        pairs = self._kept(pairs, lambda name: name.decode("utf-8", "replace"))
        if self.sort_query and len(pairs) > 1:
            pairs.sort()
        query = "&".join(
            [f"{quote_plus(name, safe='')}={quote_plus(value, safe='')}" for name, value in pairs]
        )
        scheme_end = head.find("://")
        if scheme_end > 0:
            scheme, rest = head[:scheme_end], head[scheme_end + 3 :]
            slash = rest.find("/")
            netloc, path = (rest, "") if slash == -1 else (rest[:slash], rest[slash:])
            if not self.lowercase_host:
                scheme, netloc = _restore_case(url, scheme, netloc)
            netloc = self._rewrite_hostport(scheme, netloc)
            if self.strip_trailing_slash and len(path) > 1:
                path = path.rstrip("/") or "/"
            head = f"{scheme}://{netloc}{path}"
        return _join(head, query, fragment or None)

    def _rewrite_hostport(self, scheme: str, netloc: str) -> str:
        """Apply strip_default_port and strip_www to ``[userinfo@]host[:port]``."""
        if not (self.strip_default_port or self.strip_www):
            return netloc
        userinfo, at, hostport = netloc.rpartition("@")
        if self.strip_default_port:
            lowered = scheme.lower()
            if lowered == "http" and hostport.endswith(":80"):
                hostport = hostport[:-3]
            elif lowered == "https" and hostport.endswith(":443"):
                hostport = hostport[:-4]
        # "www.example.com" -> "example.com", but "www.com" stays.
        if (
            self.strip_www
            and hostport[:4].lower() == "www."
            and "." in hostport[4:].partition(":")[0]
        ):
            hostport = hostport[4:]
        return f"{userinfo}{at}{hostport}"


def _join(head: str, query: str, fragment: str | None) -> str:
    if query:
        head = f"{head}?{query}"
    if fragment:
        head = f"{head}#{fragment}"
    return head


def _restore_case(url: str, scheme: str, netloc: str) -> tuple[str, str]:
    """Put back the case *url* had for the (lower-cased) *scheme* and host of *netloc*."""
    raw = url.strip(_C0_CONTROL_OR_SPACE).translate(_TAB_OR_NEWLINE)
    size = len(scheme)
    if raw[:size].lower() != scheme or raw[size : size + 3] != "://":
        return scheme, netloc
    scheme = raw[:size]
    rest = raw[size + 3 :]
    end = len(rest)
    for delimiter in "/?#\\":
        position = rest.find(delimiter)
        if position != -1 and position < end:
            end = position
    raw_hostport = rest[:end].rpartition("@")[2]
    userinfo, at, hostport = netloc.rpartition("@")
    if raw_hostport.lower() == hostport:
        netloc = f"{userinfo}{at}{raw_hostport}"
    return scheme, netloc


def canonicalizer_for(settings: Settings) -> Canonicalizer | None:
    """The URL canonicalizer the settings ask for (None: Scrapy's fingerprints)."""
    if not settings.canonicalize:
        return None
    if settings.canonical_drop_params:
        return Canonicalizer.from_patterns(settings.canonical_drop_params)
    return Canonicalizer()


# ------------------------------------------------------------------ per-crawl fingerprinter


@dataclass(frozen=True, slots=True, kw_only=True)
class Fingerprinter:
    """How one crawl fingerprints its requests: the mode it was created with, plus the
    options of the settings (canonicalizer, version meta key)."""

    mode: FingerprintMode = "scrapy"
    canonicalizer: Canonicalizer | None = None
    version_meta_key: str | None = None

    def url(self, url: str, method: str = "GET", body: bytes = b"") -> bytes:
        """The fingerprint of a request for *url* (seed URLs, API submissions)."""
        return fingerprint(url, method, body, canonicalizer=self.canonicalizer,
                           mode=self.mode)

    def request(self, request: Request) -> bytes:
        """The fingerprint of a :class:`scrapy.Request`."""
        return request_fingerprint(request, canonicalizer=self.canonicalizer,
                                   version_meta_key=self.version_meta_key, mode=self.mode)


def crawl_fingerprint_mode(client: Any, keys: CrawlKeys,
                           wanted: FingerprintMode | None = None) -> FingerprintMode:
    """The fingerprint mode of the crawl at *keys*, recorded in its control hash.

    A crawl without a recorded mode gets *wanted* (default ``scrapy``) recorded now, so
    the mode is fixed from the crawl's first worker or migration on. *wanted* differing
    from a recorded mode, or ``scrapy-redis`` asked of a crawl that already accepted
    requests under Scrapy's fingerprints (one from before modes were recorded), is a
    :class:`~redcrawl.errors.ConfigError`: fingerprints of two modes never match, so the
    crawl would fetch everything again.
    """
    from redcrawl.transport import redis_errors

    with redis_errors("reading the crawl's fingerprint mode"):
        recorded = client.hget(keys.control, MODE_FIELD)
        if recorded is None:
            accepted = client.hget(keys.stats, "accepted")
            if wanted == "scrapy-redis" and accepted is not None and int(accepted) > 0:
                raise ConfigError(
                    "REDCRAWL_FINGERPRINTER",
                    f"crawl {keys.crawl!r} already holds requests fingerprinted the Scrapy "
                    "way; scrapy-redis fingerprints would not match them. Use another "
                    "--crawl name, or purge the crawl first")
            if client.hsetnx(keys.control, MODE_FIELD, wanted or "scrapy"):
                return wanted or "scrapy"
            recorded = client.hget(keys.control, MODE_FIELD)  # another process was first
    mode = recorded.decode() if isinstance(recorded, bytes) else str(recorded)
    if mode not in ("scrapy", "scrapy-redis"):
        raise FrontierError(f"crawl {keys.crawl!r} records an unknown fingerprint mode "
                            f"{mode!r} in {keys.control}; upgrade redcrawl")
    if wanted is not None and wanted != mode:
        raise ConfigError(
            "REDCRAWL_FINGERPRINTER",
            f"{wanted!r}, but crawl {keys.crawl!r} was created with {mode!r} fingerprints "
            "(fixed per crawl). Leave the setting unset to follow the crawl, or purge it")
    return cast(FingerprintMode, mode)


def fingerprinter_for(settings: Settings, client: Any, keys: CrawlKeys) -> Fingerprinter:
    """The fingerprinter of the crawl at *keys*: its recorded mode (see
    :func:`crawl_fingerprint_mode`) with the settings' canonicalizer and version meta key.
    ``REDCRAWL_CANONICALIZE`` with scrapy-redis fingerprints is refused (the migrated
    fingerprints would no longer match)."""
    mode = crawl_fingerprint_mode(client, keys, settings.fingerprinter)
    canonicalizer = canonicalizer_for(settings)
    if mode == "scrapy-redis" and canonicalizer is not None:
        raise ConfigError("REDCRAWL_CANONICALIZE", f"crawl {keys.crawl!r} uses scrapy-redis "
                          "fingerprints (a migrated crawl): canonicalised URLs would not "
                          "match its imported fingerprints; turn canonicalisation off")
    return Fingerprinter(mode=mode, canonicalizer=canonicalizer,
                         version_meta_key=settings.fingerprint_version_meta)
