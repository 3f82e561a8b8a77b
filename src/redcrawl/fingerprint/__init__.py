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

Where things are: ``canonical.py`` URL canonicalisation (the fast path and
:class:`Canonicalizer`); ``hashing.py`` the Scrapy and scrapy-redis fingerprints;
``mode.py`` the per-crawl fingerprint mode recorded in Redis and :class:`Fingerprinter`.
"""

from redcrawl.fingerprint.canonical import DEFAULT_TRACKING_PARAMS as DEFAULT_TRACKING_PARAMS
from redcrawl.fingerprint.canonical import DROP_PARAMS_SETTING as DROP_PARAMS_SETTING
from redcrawl.fingerprint.canonical import Canonicalizer as Canonicalizer
from redcrawl.fingerprint.canonical import _canonical_url as _canonical_url
from redcrawl.fingerprint.canonical import _split_simple as _split_simple
from redcrawl.fingerprint.canonical import canonicalizer_for as canonicalizer_for
from redcrawl.fingerprint.hashing import FINGERPRINT_SIZE as FINGERPRINT_SIZE
from redcrawl.fingerprint.hashing import FingerprintMode as FingerprintMode
from redcrawl.fingerprint.hashing import fingerprint as fingerprint
from redcrawl.fingerprint.hashing import request_fingerprint as request_fingerprint
from redcrawl.fingerprint.mode import MODE_FIELD as MODE_FIELD
from redcrawl.fingerprint.mode import Fingerprinter as Fingerprinter
from redcrawl.fingerprint.mode import crawl_fingerprint_mode as crawl_fingerprint_mode
from redcrawl.fingerprint.mode import fingerprinter_for as fingerprinter_for

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
