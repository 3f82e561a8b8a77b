"""The per-crawl fingerprint mode: fixed when a crawl is created and recorded in its control
hash in Redis (``scrapy``, or ``scrapy-redis`` for a crawl migrated from scrapy-redis), and
the :class:`Fingerprinter` a worker builds from it and the settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from redcrawl.errors import ConfigError, FrontierError
from redcrawl.fingerprint.canonical import Canonicalizer, canonicalizer_for
from redcrawl.fingerprint.hashing import FingerprintMode, fingerprint, request_fingerprint

if TYPE_CHECKING:
    from scrapy import Request

    from redcrawl.keys import CrawlKeys
    from redcrawl.settings import Settings

MODE_FIELD = "fingerprinter"
"""Field of the crawl's control hash holding its :data:`FingerprintMode`."""


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
        return fingerprint(url, method, body, canonicalizer=self.canonicalizer, mode=self.mode)

    def request(self, request: Request) -> bytes:
        """The fingerprint of a :class:`scrapy.Request`."""
        return request_fingerprint(
            request,
            canonicalizer=self.canonicalizer,
            version_meta_key=self.version_meta_key,
            mode=self.mode,
        )


def crawl_fingerprint_mode(
    client: Any, keys: CrawlKeys, wanted: FingerprintMode | None = None
) -> FingerprintMode:
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
                    "--crawl name, or purge the crawl first",
                )
            if client.hsetnx(keys.control, MODE_FIELD, wanted or "scrapy"):
                return wanted or "scrapy"
            recorded = client.hget(keys.control, MODE_FIELD)  # another process was first
    mode = recorded.decode() if isinstance(recorded, bytes) else str(recorded)
    if mode not in ("scrapy", "scrapy-redis"):
        raise FrontierError(
            f"crawl {keys.crawl!r} records an unknown fingerprint mode "
            f"{mode!r} in {keys.control}; upgrade redcrawl"
        )
    if wanted is not None and wanted != mode:
        raise ConfigError(
            "REDCRAWL_FINGERPRINTER",
            f"{wanted!r}, but crawl {keys.crawl!r} was created with {mode!r} fingerprints "
            "(fixed per crawl). Leave the setting unset to follow the crawl, or purge it",
        )
    return cast(FingerprintMode, mode)


def fingerprinter_for(settings: Settings, client: Any, keys: CrawlKeys) -> Fingerprinter:
    """The fingerprinter of the crawl at *keys*: its recorded mode (see
    :func:`crawl_fingerprint_mode`) with the settings' canonicalizer and version meta key.
    ``REDCRAWL_CANONICALIZE`` with scrapy-redis fingerprints is refused (the migrated
    fingerprints would no longer match)."""
    mode = crawl_fingerprint_mode(client, keys, settings.fingerprinter)
    canonicalizer = canonicalizer_for(settings)
    if mode == "scrapy-redis" and canonicalizer is not None:
        raise ConfigError(
            "REDCRAWL_CANONICALIZE",
            f"crawl {keys.crawl!r} uses scrapy-redis "
            "fingerprints (a migrated crawl): canonicalised URLs would not "
            "match its imported fingerprints; turn canonicalisation off",
        )
    return Fingerprinter(
        mode=mode, canonicalizer=canonicalizer, version_meta_key=settings.fingerprint_version_meta
    )
