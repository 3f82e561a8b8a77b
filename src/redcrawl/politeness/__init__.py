"""Fleet-wide politeness: which site a request counts against, and how long a site waits.

Pure code, no Scrapy and no Redis: :func:`politeness_key` (``key.py``) maps a request to
its site's key; ``backoff.py`` parses ``Retry-After`` and computes capped exponential
backoff with jitter. The frontier stores the key with each request and enforces the
limits when it grants leases (design: docs/politeness.md).
"""

from redcrawl.politeness.backoff import (
    BackoffPolicy,
    BackoffState,
    RetryAfter,
    backoff_delay,
    forgive,
    parse_retry_after,
)
from redcrawl.politeness.key import MAX_KEY_BYTES, KeyMode, politeness_key, registrable_domain

__all__ = [
    "MAX_KEY_BYTES",
    "BackoffPolicy",
    "BackoffState",
    "KeyMode",
    "RetryAfter",
    "backoff_delay",
    "forgive",
    "parse_retry_after",
    "politeness_key",
    "registrable_domain",
]
