"""URL canonicalisation: the fast path that builds w3lib's canonical form of a URL in a
plain shape (what Scrapy's fingerprint hashes), and the opt-in :class:`Canonicalizer`
(tracking parameters dropped, default ports stripped, ...) applied before fingerprinting.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote_plus

from w3lib.url import canonicalize_url, parse_qsl_to_bytes, safe_url_string

from redcrawl.errors import ConfigError

if TYPE_CHECKING:
    from redcrawl.settings import Settings

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
        return [
            (name, value)
            for name, value in pairs
            if not (self.remove_empty_params and not value)
            and (drop_re is None or drop_re.match(decoded(name)) is None)
        ]

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
