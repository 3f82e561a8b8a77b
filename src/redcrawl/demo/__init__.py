"""Demo material for redcrawl: a deterministic local test web site ("a shop").

See :mod:`redcrawl.demo.site`. The names are loaded lazily, so that
``python -m redcrawl.demo.site`` runs the module without importing it twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redcrawl.demo.site import ShopSite, SiteConfig, canonical_path

__all__ = ["ShopSite", "SiteConfig", "canonical_path"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from redcrawl.demo import site

        return getattr(site, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
