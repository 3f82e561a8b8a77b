"""The API's routes, one module per resource; each has ``router(ctx) -> APIRouter``."""

from redcrawl.api.routes import crawls, health, metrics, requests, workers

__all__ = ["crawls", "health", "metrics", "requests", "workers"]
