"""The API's routes, one module per resource; each has ``router(ctx) -> APIRouter``."""

from redcrawl.api.routes import crawls, dashboard, health, hosts, metrics, requests, workers

__all__ = ["crawls", "dashboard", "health", "hosts", "metrics", "requests", "workers"]
