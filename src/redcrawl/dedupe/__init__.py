"""Dedupe of DONE requests: a compact exact filter, or a Bloom filter for billions of URLs.

"Queued" dedupe needs no structure of its own (a queued request's id is its fingerprint,
a field of the crawl's request hash); this package remembers the fingerprints of requests
that are DONE. Three modes, one interface (``dd_done_flags`` / ``dd_mark_done`` in Lua,
prepended to the frontier's scripts; :class:`Filter` from Python):

* ``exact`` (default): 63-bit integers in 2^b bucket sets kept in Redis's intset
  encoding, about 9 bytes per URL and no false positive short of a 63+b-bit collision.
  Buckets are planned to hold at most :data:`BUCKET_FILL` members, well under Redis's
  default ``set-max-intset-entries`` (512), so they stay compact on any server, after any
  restart, without ``CONFIG SET``; beyond the planned capacity the filter grows by levels
  of twice as many buckets.
* ``bloom`` with RedisBloom loaded (``rbloom``): BF.* filters, one per shard.
* ``bloom`` without it: redcrawl's own scalable Bloom filter on bitmaps (``lua/bloom.lua``).

A :class:`DedupeSpec` fixes the mode and its sizes for the life of a crawl; it travels to
every script as one string. With a recrawl window (``REDCRAWL_RECRAWL_AFTER``), DONE
fingerprints go into time generations that expire as whole keys.

Where things are: ``spec.py`` the spec and its plan math; ``filter.py`` the
:class:`Filter` and the Lua files per mode (``lua/``); ``importing.py`` the import of a
scrapy-redis dupefilter set.
"""

from __future__ import annotations

from redcrawl.dedupe.filter import Filter as Filter
from redcrawl.dedupe.filter import prelude as prelude
from redcrawl.dedupe.importing import ImportResult as ImportResult
from redcrawl.dedupe.importing import import_hex_set as import_hex_set
from redcrawl.dedupe.spec import BUCKET_FILL as BUCKET_FILL
from redcrawl.dedupe.spec import GENERATIONS as GENERATIONS
from redcrawl.dedupe.spec import DedupeSpec as DedupeSpec
from redcrawl.dedupe.spec import Mode as Mode
from redcrawl.dedupe.spec import bucket_key as bucket_key
from redcrawl.dedupe.spec import exact_spec as exact_spec
from redcrawl.dedupe.spec import has_redisbloom as has_redisbloom
from redcrawl.dedupe.spec import resolve_spec as resolve_spec
from redcrawl.dedupe.spec import split as split

__all__ = [
    "BUCKET_FILL",
    "GENERATIONS",
    "DedupeSpec",
    "Filter",
    "ImportResult",
    "bucket_key",
    "exact_spec",
    "has_redisbloom",
    "import_hex_set",
    "prelude",
    "resolve_spec",
    "split",
]
