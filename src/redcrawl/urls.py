"""Which URLs a crawl accepts: one rule for the API, ``redcrawl seed``, RedisSpider start
entries and the Scheduler.

A URL is accepted when it is absolute, its scheme is http or https (others only where a
caller opts in), and its host is a real host name: no whitespace, no control characters,
IDNA-encodable, or an IP literal. :func:`url_problem` says in words what is wrong.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

__all__ = ["HTTP_SCHEMES", "loopback_host", "url_problem"]

HTTP_SCHEMES = frozenset({"http", "https"})

# A DNS label after IDNA encoding (underscores are tolerated: real sites use them).
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f]")


def _host_problem(host: str) -> str | None:
    if not host:
        return "it has no host"
    if host.startswith("["):
        if not host.endswith("]"):
            return f"host {host!r} is not a valid IPv6 literal"
        try:
            ipaddress.IPv6Address(host[1:-1].split("%", 1)[0])
        except ValueError:
            return f"host {host!r} is not a valid IPv6 literal"
        return None
    if _BAD_CHARS.search(host):
        return f"host {host!r} contains whitespace or control characters"
    try:
        ipaddress.IPv4Address(host)
        return None
    except ValueError:
        pass
    try:
        ascii_host = host.rstrip(".").encode("idna").decode("ascii").lower()
    except UnicodeError:
        return f"host {host!r} is not a valid host name"
    labels = ascii_host.split(".")
    if not ascii_host or not all(_LABEL.match(label) for label in labels):
        return f"host {host!r} is not a valid host name"
    return None


def url_problem(url: str, schemes: frozenset[str] = HTTP_SCHEMES) -> str | None:
    """Why ``url`` cannot be crawled, in words, or None when it can."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        return f"it is not a valid URL ({exc})"
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        allowed = " or ".join(sorted(f"{s}://" for s in schemes))
        return f"it is not an absolute {allowed} URL"
    del port
    hostport = parts.netloc.rpartition("@")[2]
    if hostport.startswith("["):
        host = hostport[: hostport.find("]") + 1] if "]" in hostport else hostport
    else:
        host = hostport.split(":", 1)[0]
    return _host_problem(host)


def loopback_host(host: str) -> bool:
    """True if ``host`` only accepts connections from this machine."""
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
