"""The HTTP control plane (FastAPI): ``redcrawl serve``. Being built (issue 4)."""

from __future__ import annotations

from redcrawl.errors import ConfigError
from redcrawl.settings import Settings

__all__ = ["serve"]


def serve(settings: Settings) -> None:
    """Run the control plane until interrupted."""
    raise ConfigError("serve", "the HTTP control plane is not built yet")
