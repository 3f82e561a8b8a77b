"""Health: the process is up, Redis answers."""

from __future__ import annotations

import redis.exceptions
from fastapi import APIRouter

from redcrawl.api import models as m
from redcrawl.api.context import Context, log
from redcrawl.api.errors import RESPONSES, NotReady, ServerRefused, StateErrors, responses
from redcrawl.cluster import ClusterClient, cluster_state
from redcrawl.errors import ConnectionError_
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
        # (no token needed, for probes: a 503 says Redis is unavailable, not where it is
        # or as whom; the reason goes to the API's log)
        try:
            client = ctx.client()
            with redis_errors("ping"):
                client.ping()
                if isinstance(client, ClusterClient):
                    try:
                        state = cluster_state(client)
                    except redis.exceptions.ResponseError:
                        state = "ok"  # (an ACL user without CLUSTER INFO: as at start)
                    if state != "ok":
                        raise ConnectionError_(
                            "the Redis Cluster does not serve every slot (a master says "
                            f"cluster_state:{state}): a master and its replicas may be down"
                        )
        except ServerRefused:
            raise  # (the server's policy, said to every caller: nothing about where it is)
        except ConnectionError_ as exc:
            log.warning("redcrawl API: not ready: %s", exc)
            raise NotReady("Redis is unavailable (the API's log says why); retry later") from None
        return m.Health(status="ok")

    return r
