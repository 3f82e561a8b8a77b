"""A REQUEST_FINGERPRINTER_CLASS of a project's own: URLs that differ only by tracking
parameters (``utm_*``, ``ref``) are one request. (32-byte fingerprints, unlike Scrapy's
20.)"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit


class NoTracking:
    def __init__(self, crawler: Any = None) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Any) -> NoTracking:
        return cls(crawler)

    def fingerprint(self, request: Any) -> bytes:
        parts = urlsplit(request.url)
        query = [
            (k, v) for k, v in parse_qsl(parts.query) if not (k.startswith("utm_") or k == "ref")
        ]
        url = parts._replace(query=urlencode(query)).geturl()
        return hashlib.sha256(f"{request.method} {url}".encode()).digest()
