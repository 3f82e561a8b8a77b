"""Which ``Host`` and ``Origin`` headers the API answers: a guard against DNS rebinding and
cross-site requests from web pages.

Without tokens, the API trusts whoever can reach its loopback port, which includes every
web page open in the user's browser: a page can POST to ``http://127.0.0.1:8700`` (the
browser sends it, whatever CORS says about reading the answer), and a page on a name the
attacker re-points at 127.0.0.1 (DNS rebinding) can even read the answers. So:

* the ``Host`` header must name the address the API is bound to (with its port), or
  ``localhost`` when that address is a loopback one, or a name listed in
  ``REDCRAWL_API_ALLOWED_HOSTS`` (the name clients use behind a proxy; ``*``: any). An API
  bound to every address (``0.0.0.0``, ``::``) needs tokens and answers any ``Host``
  unless the list is given.
* a state-changing call (``POST``, ``PUT``, ``PATCH``, ``DELETE``) with an ``Origin``
  header is refused unless that origin is the API itself (``http(s)://<its Host>``, as
  its own ``/docs`` page sends). Clients that are not browsers send no ``Origin``.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from redcrawl.settings import Settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["HostGuard", "allowed_hosts", "bind_address"]

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def bind_address(host: str) -> str:
    """``host`` as a socket bind address: an IPv6 literal without its brackets."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


def _host_literal(host: str) -> str:
    """``host`` as it appears in a Host header (IPv6 literals in brackets), lower-case."""
    host = bind_address(host).lower().rstrip(".")
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    except ValueError:
        pass
    return host


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "[::1]"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """Host names (lower-case, IPv6 literals in brackets, no port) the API answers besides
    the address a connection came in on, or None when any host is accepted."""
    extra = {h.strip().lower() for h in settings.api_allowed_hosts if h.strip()}
    if "*" in extra:
        return None
    bound = bind_address(settings.api_host).lower()
    if bound in WILDCARDS and not extra:
        return None
    names = {_host_literal(h) for h in extra}
    if bound not in WILDCARDS:
        names.add(_host_literal(bound))
        try:  # a name binds the addresses it resolves to: accept those as well
            for info in socket.getaddrinfo(bound, None, proto=socket.IPPROTO_TCP):
                names.add(_host_literal(str(info[4][0])))
        except (OSError, UnicodeError):
            pass
    return frozenset(names)


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


class HostGuard:
    """Refuse (400) a ``Host`` that names neither the address the connection came in on
    (with its port) nor one of ``allowed``, and (403) a state-changing call from a foreign
    ``Origin``, before anything else runs."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.allowed = allowed

    def _host_ok(self, host: str, server: Any) -> bool:
        if self.allowed is None:
            return True
        if not server:
            return False
        local, port = _host_literal(str(server[0])), int(server[1])
        names = self.allowed | {local}
        if any(_is_loopback(n) for n in names):
            names |= LOOPBACK_NAMES
        name, given = _split(host)
        if name.rstrip(".") not in names:
            return False
        return given == str(port) or (given == "" and port == 80)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        host = headers.get(b"host", b"").decode("latin-1").strip().lower()
        if not self._host_ok(host, scope.get("server")):
            await _refuse(
                send,
                400,
                f"Host header {host!r} is not an address this API "
                "answers: call it by the address it is bound to (or localhost), "
                "or list the name in REDCRAWL_API_ALLOWED_HOSTS (DNS rebinding "
                "protection)",
            )
            return
        origin = headers.get(b"origin")
        if origin is not None and scope.get("method", "GET").upper() in UNSAFE_METHODS:
            text = origin.decode("latin-1").strip()
            if not _same_origin(text, host):
                await _refuse(
                    send,
                    403,
                    f"cross-site request refused: Origin {text!r} "
                    "is not this API; state-changing calls are accepted from "
                    "clients that send no Origin header (curl, scripts) or from "
                    "the API's own pages",
                )
                return
        await self.app(scope, receive, send)


def _same_origin(origin: str, host: str) -> bool:
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    default = "80" if parts.scheme == "http" else "443"
    return _with_port(parts.netloc.lower(), default) == _with_port(host, default)


def _split(hostport: str) -> tuple[str, str]:
    """("host", "port") of "host:port", ("host", "") without a port."""
    if hostport.endswith("]") or ":" not in hostport.rpartition("]")[2]:
        return hostport, ""
    name, _, port = hostport.rpartition(":")
    return name, port


def _with_port(hostport: str, default: str) -> str:
    """``host:port``, with ``default`` when the port is left out."""
    name, port = _split(hostport)
    return f"{name}:{port or default}"


async def _refuse(send: Send, status: int, detail: str) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
