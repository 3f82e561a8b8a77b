"""The bounds and names the workers, the ack step and the exporter share (no
dependencies: workers import this without ``prometheus-client``)."""

from __future__ import annotations

__all__ = ["DOWNLOAD_BOUNDS_MS", "ERROR_KINDS", "LATENCY_BOUNDS_MS", "STORED"]

LATENCY_BOUNDS_MS = (
    100,
    500,
    1000,
    5000,
    10000,
    30000,
    60000,
    300000,
    900000,
    3600000,
    14400000,
    86400000,
)
"""Upper bounds (ms) of the enqueue -> DONE histogram's buckets, then ``inf``
(``LAT_BOUNDS`` in frontier/lua/latency.lua: keep them equal)."""
DOWNLOAD_BOUNDS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
"""Upper bounds (ms) of the download latency histogram's buckets, then ``inf``."""
ERROR_KINDS = ("download", "http_4xx", "http_5xx", "callback", "item")
"""The error kinds a worker counts (``err:<kind>`` in the stats hash)."""
STORED = ("inserted", "updated")
"""UpsertPipeline's outcomes (``stored:<result>`` in the stats hash)."""
