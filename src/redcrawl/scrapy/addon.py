"""``ADDONS = {"redcrawl.scrapy.Addon": 0}``: a Scrapy add-on (Scrapy 2.10+) that puts a
project on redcrawl, the way ``scrapy startproject``'s settings invite.

It sets ``SCHEDULER`` and ``DUPEFILTER_CLASS`` to redcrawl's at the add-on priority, so a
value of the project's own settings wins, as Scrapy's add-ons do; one that is not
redcrawl's (a migrated project still naming scrapy-redis's scheduler) is said with a
WARNING naming the line to remove, rather than leaving the crawl off redcrawl silently.
Everything else (robots.txt, AutoThrottle, the 429/503 deferral) the scheduler sets up
itself, as with the two settings written by hand. It also flushes local feed files after
each item (``FEED_STORAGES_BASE``, :mod:`redcrawl.scrapy.feed_storage`), so that a SIGKILLed
worker's ``-o`` file has every item of the requests it finished.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["Addon"]

log = logging.getLogger(__name__)

COMPONENTS = {
    "SCHEDULER": "redcrawl.scrapy.Scheduler",
    "DUPEFILTER_CLASS": "redcrawl.scrapy.DupeFilter",
}


def _ours(value: object, path: str) -> bool:
    """Whether a SCHEDULER / DUPEFILTER_CLASS value is redcrawl's (or a subclass)."""
    from scrapy.utils.misc import load_object

    try:
        cls = load_object(value) if isinstance(value, str) else value
    except (ImportError, NameError, ValueError, AttributeError):
        return False
    # (not issubclass: Scrapy's BaseScheduler counts any class with its methods as one)
    return load_object(path) in getattr(cls, "__mro__", ())


class Addon:
    """Scrapy add-on: redcrawl's scheduler and dupefilter (see the module docstring)."""

    def update_settings(self, settings: BaseSettings) -> None:
        from redcrawl.scrapy.feed_storage import FEED_STORAGES_BASE

        settings.set("FEED_STORAGES_BASE", FEED_STORAGES_BASE, "addon")
        for name, path in COMPONENTS.items():
            settings.set(name, path, "addon")
            value = settings.get(name)
            if not _ours(value, path):
                log.warning(
                    "redcrawl: the add-on is enabled but the project's settings set %s = %r, "
                    "which wins over an add-on: remove that line to crawl on redcrawl",
                    name,
                    value,
                )
