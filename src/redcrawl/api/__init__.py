"""The HTTP control plane (FastAPI): ``redcrawl serve``. See ``docs/api.md``.

:func:`create_app` builds the app (tests pass their own Redis client); :func:`serve` runs
it with uvicorn until interrupted.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from redcrawl.errors import ConfigError, ConnectionError_
from redcrawl.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from fastapi import FastAPI

__all__ = ["check_bind", "create_app", "serve"]

log = logging.getLogger(__name__)


MIN_TOKEN_CHARS = 16
"""The shortest API token served: a shorter one can be guessed (``openssl rand -hex 24``
gives 48 characters)."""


def check_bind(settings: Settings) -> None:
    """Refuse to serve an API without tokens beyond this machine, or with a token short
    enough to guess (loopback or not: other users of the machine reach it too)."""
    from redcrawl.api.auth import loopback_host, open_access

    for name, tokens in (
        ("REDCRAWL_API_ADMIN_TOKENS", settings.api_admin_tokens),
        ("REDCRAWL_API_TOKENS", settings.api_tokens),
    ):
        short = [t for t in tokens if len(t) < MIN_TOKEN_CHARS]
        if short:
            raise ConfigError(
                name,
                f"{len(short)} of its tokens {'is' if len(short) == 1 else 'are'} shorter than "
                f"{MIN_TOKEN_CHARS} characters ({len(short[0])}), short enough to guess. Give "
                "random tokens, e.g. from `openssl rand -hex 24`",
            )

    if open_access(settings) and not loopback_host(settings.api_host):
        raise ConfigError(
            "REDCRAWL_API_HOST",
            f"{settings.api_host!r} is not a loopback address, and no API token is set, so "
            "anyone who can reach it could submit, requeue and purge crawls. Set "
            "REDCRAWL_API_ADMIN_TOKENS (and REDCRAWL_API_TOKENS for read-only access), or "
            "bind 127.0.0.1",
        )
    if open_access(settings):
        beyond = [h for h in settings.api_allowed_hosts if not loopback_host(h)]
        if beyond:
            raise ConfigError(
                "REDCRAWL_API_ALLOWED_HOSTS",
                f"{', '.join(map(repr, beyond))} is not a loopback name, and no API token is "
                "set: a web page served under that name (DNS rebinding) could submit, "
                "requeue and purge crawls. Set REDCRAWL_API_ADMIN_TOKENS (and "
                "REDCRAWL_API_TOKENS for read-only access), or remove it",
            )


def create_app(
    settings: Settings,
    client: redis.Redis | None = None,
    *,
    clock: Callable[[], float] | None = None,
    check_server: bool = False,
) -> FastAPI:
    """The FastAPI app (see :mod:`redcrawl.api.app`); FastAPI is imported only here."""
    from redcrawl.api.app import create_app as build

    return build(settings, client, clock=clock, check_server=check_server)


def serve(settings: Settings) -> None:
    """Run the control plane on ``api_host:api_port`` until interrupted."""
    check_bind(settings)
    import uvicorn

    from redcrawl.api.app import create_app as build
    from redcrawl.api.auth import open_access
    from redcrawl.api.hosts import bind_address
    from redcrawl.connection import connect
    from redcrawl.guard import check_memory_policy

    checked = False
    try:
        client = connect(settings)
    except ConnectionError_ as exc:
        if not _unreachable(exc):
            raise  # a refused login or command is not "Redis is starting": exit 3
        # the API answers /v1/health and, with 503 until Redis is up, /v1/ready (the
        # probes of deploy/kubernetes/serve.yaml): not a crash loop while Redis starts
        _warn(
            f"redcrawl API: Redis is not reachable now ({exc}); serving anyway: /v1/ready "
            "and every call that reads Redis answer 503 until it is (its eviction policy is "
            "checked when it first answers: an evicting server is refused then, 503)"
        )
    else:
        try:
            for warning in check_memory_policy(client, settings):  # an evicting server: refused
                _warn(f"redcrawl API: {warning}")
        finally:
            client.close()
        checked = True
    if open_access(settings):
        _warn(
            f"redcrawl API: no tokens configured: open WITHOUT authentication, on "
            f"loopback only ({settings.api_host}:{settings.api_port}). Set "
            "REDCRAWL_API_ADMIN_TOKENS to require tokens."
        )
    uvicorn.run(
        build(settings, check_server=not checked),
        host=bind_address(settings.api_host),
        port=settings.api_port,
        log_level="info",
        access_log=False,
    )


def _unreachable(exc: ConnectionError_) -> bool:
    """Whether ``connect`` failed because the server did not answer (connection refused,
    a timeout): it may be starting. A refused login (``login_refused``), an ACL refusal or
    a refused first command is a configuration error, said at start (exit 3)."""
    import redis.exceptions

    cause = exc.__cause__ or exc.__context__
    refused = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)
    return isinstance(
        cause, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError
    ) and not isinstance(cause, refused)


def _warn(message: str) -> None:
    """Say ``message`` once: through logging when it is configured, else on stderr
    (logging's own last-resort output would print it a second time)."""
    if log.hasHandlers():
        log.warning(message)
    else:
        print(f"warning: {message}", file=sys.stderr, flush=True)
