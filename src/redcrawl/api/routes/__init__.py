"""The API's routes, one module per resource; each has ``router(ctx) -> APIRouter``."""

from redcrawl.api.routes import crawls, dashboard, health, metrics, requests, workers

__all__ = ["crawls", "dashboard", "health", "metrics", "requests", "workers"]
