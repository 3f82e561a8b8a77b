"""One typed settings object for every redcrawl component.

:class:`Settings` is built from Scrapy settings (:meth:`Settings.from_scrapy`), from
``REDCRAWL_*`` environment variables (:meth:`Settings.from_env`) and from CLI flags
(:meth:`Settings.replace`). Precedence, highest first: CLI flags, Scrapy's command line
(``scrapy crawl -s``), ``REDCRAWL_*`` environment variables, the spider's and project's
Scrapy settings, defaults.

Each setting has one canonical name, ``REDCRAWL_<FIELD>`` in upper case, and
scrapy-redis's names are accepted as aliases (``REDIS_URL``, ``SCHEDULER_PERSIST``, …), so a
scrapy-redis project's ``settings.py`` keeps working. An unknown ``REDCRAWL_*`` name or a
value that does not parse is a :class:`~redcrawl.errors.ConfigError` naming the setting.
:func:`startup_notes` and :func:`startup_warnings` say, at start, where redcrawl's choices
differ from what scrapy-redis would do with the same settings.
Where things are: ``table.py`` the table of settings (names, parsers, docs, aliases), from
which ``docs/settings.md`` is generated (``doc.py`` makes its rows); ``model.py`` the
:class:`Settings` object, its loading, precedence and validation; ``notes.py`` the startup
notes and warnings.
"""

from redcrawl.settings.doc import SETTINGS_DOC as SETTINGS_DOC
from redcrawl.settings.doc import _show as _show
from redcrawl.settings.model import CMDLINE_PRIORITY as CMDLINE_PRIORITY
from redcrawl.settings.model import Settings as Settings
from redcrawl.settings.notes import ignored_setting_reason as ignored_setting_reason
from redcrawl.settings.notes import startup_notes as startup_notes
from redcrawl.settings.notes import startup_warnings as startup_warnings
from redcrawl.settings.table import PRIORITY_LIMIT as PRIORITY_LIMIT
from redcrawl.settings.table import QUEUE_CLASSES as QUEUE_CLASSES
from redcrawl.settings.table import Ordering as Ordering

__all__ = [
    "QUEUE_CLASSES",
    "SETTINGS_DOC",
    "Ordering",
    "Settings",
    "startup_notes",
    "startup_warnings",
]
