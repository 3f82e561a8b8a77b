"""Health: the process is up, Redis answers."""

from __future__ import annotations

from fastapi import APIRouter

from redcrawl.api import models as m
from redcrawl.api.context import Context
from redcrawl.api.errors import RESPONSES, StateErrors, responses
from redcrawl.transport import redis_errors


def router(ctx: Context) -> APIRouter:
    """The routes, bound to the app's :class:`Context`."""
    r = APIRouter(route_class=StateErrors)

    @r.get(
        "/v1/health",
        tags=["health"],
        summary="The API process is up",
        responses={400: RESPONSES[400]},
    )
    def health() -> m.Health:
        return m.Health(status="ok")

    @r.get("/v1/ready", tags=["health"], summary="Redis answers", responses=responses(503))
    def ready() -> m.Health:
        with redis_errors("ping"):
            ctx.client().ping()
        return m.Health(status="ok")

    return r
