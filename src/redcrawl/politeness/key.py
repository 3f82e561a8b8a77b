"""The politeness key of a request: which site's limits it counts against.

The same key Scrapy's downloader gives its slots (``Downloader.get_slot_key``): the
request's ``meta["download_slot"]`` when set, else the URL's host name without the port,
lower-case, IDNA-encoded exactly as ``scrapy.Request`` encodes it (``w3lib``'s
``safe_url_string``). A few inputs get a better-defined key than Scrapy's; the table of
every case is in docs/politeness.md ("The politeness key"):

==============================  ==========================  ==============================
input                           key                         Scrapy's slot key
==============================  ==========================  ==============================
``http://Example.COM:8080/a``   ``example.com``             the same
``http://bücher.de/``           ``xn--bcher-kva.de``        the same
``http://[::1]:8080/``          ``::1`` (no brackets)       the same
``http://[2001:DB8:0::1]/``     ``2001:db8::1``             ``2001:db8:0::1``
``http://example.com./``        ``example.com``             ``example.com.``
``data:,x`` / ``file:///x``     ``data:`` / ``file:``       ``""`` (one slot for all)
``meta["download_slot"]="S"``   ``S`` (as given)            the same
a key over 255 UTF-8 bytes      its first 64 bytes (whole   the key itself
                                characters), ``~``, 32 hex
                                digits of BLAKE2b
==============================  ==========================  ==============================

``mode="domain"`` groups host names by registrable domain (``www.example.co.uk`` and
``shop.example.co.uk`` -> ``example.co.uk``) with ``tldextract``'s bundled Public Suffix
List snapshot, ICANN section only, never fetched from the network. IP addresses, hosts
under no known suffix (``localhost``) and keys from ``download_slot`` stay as they are.

This module knows nothing of Scrapy or Redis: it maps strings to strings.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["MAX_KEY_BYTES", "KeyMode", "politeness_key", "registrable_domain"]

KeyMode = Literal["host", "domain"]

MAX_KEY_BYTES = 255
"""A key longer than this (UTF-8 bytes) is shortened to ``HASHED_PREFIX`` bytes of
itself, ``~`` and a digest (see :func:`_bounded`): at most 97 bytes. A DNS name has at
most 253 characters, so only ``download_slot`` values and malformed hosts are ever
shortened."""

HASHED_PREFIX = 64
"""Bytes (whole UTF-8 characters) of a too-long key kept, readable, before its digest."""


def politeness_key(url: str, download_slot: object = None, mode: KeyMode = "host") -> str:
    """The politeness key of a request for ``url`` (see the module docstring).

    ``download_slot`` is the request's ``meta.get("download_slot")``: when it is not None
    it is the key, whatever ``mode`` says (it must be a ``str``). Raises ``ValueError`` for
    a URL Python cannot split (an unclosed ``[``; a bad port is not an error, the port is
    not part of the key) and for an unknown ``mode``; ``TypeError`` for a non-string slot.
    """
    if mode not in ("host", "domain"):
        raise ValueError(f"politeness key mode {mode!r} is unknown: use 'host' or 'domain'")
    if download_slot is not None:
        if not isinstance(download_slot, str):
            raise TypeError(
                f"meta['download_slot'] is a {type(download_slot).__name__}, not a str: "
                "give the slot a string name (or leave it unset to use the host)"
            )
        return _printable(_bounded(download_slot))
    host = _host(url)
    if host is None:
        scheme = _scheme(url)
        return f"{scheme}:"
    if mode == "domain":
        host = registrable_domain(host)
    return _bounded(host)


def _scheme(url: str) -> str:
    scheme = urlsplit(url.strip()).scheme.lower()
    return scheme or "none"


def _host(url: str) -> str | None:
    """The host as Scrapy's downloader sees it, normalised; None when the URL has none."""
    try:
        if not url.isascii():
            # what scrapy.Request does to a URL: IDNA (Python's codec, as w3lib uses it),
            # NFKC for full-width characters, percent-encoding of the rest
            from w3lib.url import safe_url_string

            url = safe_url_string(url)
        host = urlsplit(url.strip()).hostname
    except ValueError as exc:  # UnicodeError included
        raise ValueError(
            f"no politeness key for {url[:200]!r}: it is not a valid URL ({exc}); fix the "
            "URL or set meta['download_slot']"
        ) from None
    if not host:
        return None
    if ":" in host:
        return _ipv6(host)
    host = _printable(host.rstrip("."))
    return host or None


def _printable(key: str) -> str:
    """``key`` with its control characters percent-encoded (``%1B``): a crawled link's
    host may hold an ESC that Scrapy keeps, and a key is shown in the operator's terminal
    and typed back into ``redcrawl hosts``."""
    if key.isprintable():
        return key
    return "".join(c if c.isprintable() else f"%{ord(c):02X}" for c in key)


def _ipv6(host: str) -> str:
    """An IPv6 literal in its compressed form (zone id kept as written)."""
    address, sep, zone = host.partition("%")
    try:
        address = ipaddress.IPv6Address(address).compressed
    except ValueError:
        return host  # urlsplit accepted it; keep it as it is rather than guess
    return address + sep + zone


def _bounded(key: str) -> str:
    """``key``, or a bounded stand-in for it when it is over ``MAX_KEY_BYTES``: its first
    ``HASHED_PREFIX`` bytes (whole characters only), ``~`` and a 128-bit digest of it."""
    if len(key) <= MAX_KEY_BYTES // 4:
        return key  # at most 4 UTF-8 bytes a character
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_KEY_BYTES:
        return key
    prefix = raw[:HASHED_PREFIX].decode("utf-8", "ignore")  # a cut character is dropped
    return f"{prefix}~{hashlib.blake2b(raw, digest_size=16).hexdigest()}"


@functools.cache
def _extractor() -> object:
    import tldextract

    # suffix_list_urls=() and cache_dir=None: the snapshot bundled with the package, no
    # network fetch and no cache file; ICANN suffixes only (see registrable_domain)
    return tldextract.TLDExtract(
        suffix_list_urls=(), cache_dir=None, include_psl_private_domains=False
    )


@functools.lru_cache(maxsize=65536)
def registrable_domain(host: str) -> str:
    """The registrable domain of ``host`` (``a.b.example.co.uk`` -> ``example.co.uk``).

    IP addresses and names under no public suffix (``localhost``, ``intranet``) are
    returned unchanged. Private-section suffixes (``github.io``, ``blogspot.com``) are
    not suffixes here: every ``*.github.io`` site shares ``github.io``'s key, the
    conservative choice for servers they share."""
    host = host.rstrip(".").lower()
    if ":" in host:
        return host
    try:
        ipaddress.IPv4Address(host)
        return host
    except ValueError:
        pass
    result = _extractor()(host)  # type: ignore[operator]
    domain: str = result.top_domain_under_public_suffix
    return domain or host
