"""Who may see and act on the dashboard (:mod:`redcrawl.api.routes.dashboard`), and the
response every page is sent in.

Access is the API's: a read token to look, an admin token to act. A browser cannot send a
bearer header on a page load, so ``/login`` takes the token in a form and keeps it in a
cookie (:data:`COOKIE`) that is checked exactly like the header. Forms carry a CSRF token:
an HMAC of the session (the token, or a random cookie, :data:`SESSION`, when the API is
open) under a key derived from the configured tokens, so every API process behind a
balancer accepts it. Pages are sent with a Content-Security-Policy that allows no script.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from redcrawl.api.auth import _matches, open_access
from redcrawl.api.dashboard_html import _layout
from redcrawl.settings import Settings

__all__ = ["COOKIE", "CSP", "MAX_FORM", "SESSION", "Access", "Level", "Viewer"]

COOKIE = "redcrawl_token"
"""The cookie holding the token given at ``/login``."""
SESSION = "redcrawl_session"
"""Without tokens: a random cookie the CSRF token is tied to."""
MAX_FORM = 4096
"""Largest form body a dashboard POST reads."""
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

Level = Literal["read", "admin"]


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who asks: ``level`` None when not allowed in; ``session`` what the CSRF token is
    tied to; ``new_session`` a random session cookie to set (open API, first visit)."""

    level: Level | None
    session: str
    new_session: str = ""


class Access:
    """The dashboard's access checks under ``settings``' tokens (everyone is an admin
    when none is configured): who asks, the CSRF token of their session, and
    :meth:`page`, the response every page is sent in."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.is_open = open_access(settings)
        if self.is_open:
            self.csrf_key = secrets.token_bytes(32)  # loopback only, one process
        else:
            material = "\0".join(sorted(settings.api_admin_tokens + settings.api_tokens))
            self.csrf_key = hashlib.sha256(
                b"redcrawl dashboard csrf\0" + material.encode()
            ).digest()

    def level_of(self, token: str) -> Level | None:
        if _matches(token, self.settings.api_admin_tokens):
            return "admin"
        if _matches(token, self.settings.api_tokens):
            return "read"
        return None

    def viewer(self, request: Request) -> Viewer:
        if self.is_open:
            session = request.cookies.get(SESSION, "")
            if len(session) < 16:
                session = secrets.token_urlsafe(24)
                return Viewer("admin", session, new_session=session)
            return Viewer("admin", session)
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not (scheme.lower() == "bearer" and token.strip()):
            token = request.cookies.get(COOKIE, "")
        token = token.strip()
        return Viewer(self.level_of(token) if token else None, token)

    def csrf(self, v: Viewer) -> str:
        return hmac.new(self.csrf_key, b"csrf\0" + v.session.encode(), hashlib.sha256).hexdigest()

    def page(
        self, v: Viewer, title: str, body: str, *, status: int = 200, refresh: int = 0
    ) -> HTMLResponse:
        resp = HTMLResponse(
            _layout(
                title,
                body,
                refresh=refresh,
                logged_in=not self.is_open and v.level is not None and bool(v.session),
            ),
            status_code=status,
        )
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "same-origin"  # no-referrer makes Origin "null"
        if v.new_session:
            resp.set_cookie(SESSION, v.new_session, httponly=True, samesite="strict", path="/")
        return resp

    @staticmethod
    def to_login(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)


def _form_fields(raw: bytes) -> dict[str, str]:
    """An urlencoded form, the first value of each field."""
    parsed = parse_qs(raw.decode("utf-8", errors="replace"), max_num_fields=20)
    return {k: vals[0] for k, vals in parsed.items() if vals}


def _local(target: str) -> str:
    """``target`` if it is a path of this site, else ``/`` (no open redirect)."""
    if (
        target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and all(31 < ord(ch) < 127 for ch in target)
    ):
        return target
    return "/"
