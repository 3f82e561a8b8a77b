"""redcrawl: a distributed crawl frontier for Scrapy on Redis.

Leases, retries with backoff, dead letters, weighted-fair priority tiers and compact
dedupe, with every state change one atomic Redis step.
"""

from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.errors import (
    ConfigError,
    ConnectionLost,
    DecodeError,
    EncodeError,
    FrontierError,
    LockError,
    RedcrawlError,
    RedisUnavailable,
)
from redcrawl.frontier import (
    Counts,
    Frontier,
    Lease,
    ListsFrontier,
    PushResult,
    StreamsFrontier,
    open_frontier,
)
from redcrawl.lock import CrawlLock
from redcrawl.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ConnectionLost",
    "Counts",
    "CrawlLock",
    "DecodeError",
    "EncodeError",
    "Envelope",
    "Frontier",
    "FrontierError",
    "Lease",
    "ListsFrontier",
    "LockError",
    "PushResult",
    "RedcrawlError",
    "RedisUnavailable",
    "Settings",
    "StreamsFrontier",
    "__version__",
    "connect",
    "open_frontier",
]
