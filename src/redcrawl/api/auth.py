"""Bearer-token access: read tokens see, admin tokens also change things.

Without any token configured the API is open (``serve`` then binds loopback only).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from redcrawl.settings import Settings
from redcrawl.urls import loopback_host

__all__ = ["Access", "loopback_host", "require"]

Access = Literal["read", "admin"]

bearer = HTTPBearer(
    auto_error=False,
    description="A read token (REDCRAWL_API_TOKENS) or an admin token (REDCRAWL_API_ADMIN_TOKENS).",
)


def _matches(token: str, tokens: tuple[str, ...]) -> bool:
    # Compare against every token (no early exit) in constant time per token.
    found = False
    for candidate in tokens:
        found |= hmac.compare_digest(token.encode(), candidate.encode())
    return found


def open_access(settings: Settings) -> bool:
    """True when no token is configured: every endpoint is open."""
    return not settings.api_tokens and not settings.api_admin_tokens


def require(settings: Settings, level: Access) -> Callable[..., None]:
    """A FastAPI dependency that lets a request through with ``level`` access. Without
    tokens it checks nothing and declares no security scheme in the OpenAPI schema."""
    if open_access(settings):

        def open_door() -> None:
            return None

        return open_door

    def check(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        if creds is None or creds.scheme.lower() != "bearer":
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if _matches(creds.credentials, settings.api_admin_tokens):
            return
        if _matches(creds.credentials, settings.api_tokens):
            if level == "read":
                return
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                "this token is read-only; this endpoint needs an admin token "
                "(REDCRAWL_API_ADMIN_TOKENS)",
            )
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "unknown bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )

    return check
