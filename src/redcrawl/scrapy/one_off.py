"""Scrapy's one-off commands (``scrapy shell``, ``fetch``, ``view``, ``parse``, ``check``)
in a project switched to redcrawl: they run their requests in their own process, never
through the shared crawl.

These commands fetch a few requests for a person to look at, through the project's
settings, so with ``SCHEDULER = "redcrawl.scrapy.Scheduler"`` they would open the crawl in
Redis as one more worker. Seen before: each of them stopped with ``unstorable_request``
(their requests carry callbacks of the command, not of the spider, and ``shell`` a meta
value Redis cannot hold) and ``fetch`` printed nothing; had they got further, they would
have leased the crawl's own requests and, with a :class:`~redcrawl.scrapy.RedisSpider`,
taken its start URLs off the Redis key. Under one of them redcrawl's scheduler and
dupefilter hand over to Scrapy's own (in memory) and a RedisSpider reads no start URLs:
nothing in Redis is read or written, as the command would do on a plain project.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy.core.scheduler import BaseScheduler
    from scrapy.crawler import Crawler

__all__ = ["ONE_OFF_COMMANDS", "local_dupefilter", "local_scheduler", "one_off_command"]

log = logging.getLogger(__name__)

ONE_OFF_COMMANDS = frozenset({"shell", "fetch", "view", "parse", "check"})
"""Scrapy's commands that fetch requests for a person to look at, not to crawl."""

_SCRAPY_SCRIPTS = frozenset({"scrapy", "scrapy.exe", "scrapy-script.py"})
_SCRAPY_MAINS = ("scrapy/__main__.py", "scrapy/cmdline.py")
_SCRAPY_MODULES = frozenset({"scrapy", "scrapy.cmdline"})
_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def one_off_command(orig_argv: Sequence[str] | None = None) -> str | None:
    """The one-off Scrapy command this process runs (one of :data:`ONE_OFF_COMMANDS`), or
    None. Read from the interpreter's command line (``sys.orig_argv``: ``scrapy.cmdline``
    takes the command out of ``sys.argv``): the program must be Scrapy's (the ``scrapy``
    script or ``python -m scrapy``), and the command is its first argument that is not an
    option, as ``scrapy.cmdline`` reads it."""
    argv = list(sys.orig_argv if orig_argv is None else orig_argv)
    i = 1
    while i < len(argv):  # the interpreter's own options, up to the program
        arg = argv[i]
        if arg == "-c":
            return None
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            module = arg[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            if module not in _SCRAPY_MODULES:
                return None
            rest = argv[i + (1 if arg[2:] else 2) :]
            break
        if arg in _OPTIONS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        program = arg.replace(os.sep, "/")
        scrapy = os.path.basename(program).lower() in _SCRAPY_SCRIPTS
        if not (scrapy or program.endswith(_SCRAPY_MAINS)):
            return None
        rest = argv[i + 1 :]
        break
    else:
        return None
    for arg in rest:
        if not arg.startswith("-"):
            return arg if arg in ONE_OFF_COMMANDS else None
    return None


def local_scheduler(crawler: Crawler, command: str) -> BaseScheduler:
    """Scrapy's own scheduler (its dupefilter built from ``DUPEFILTER_CLASS``: redcrawl's
    hands over too, :func:`local_dupefilter`), with one INFO line saying so."""
    from scrapy.core.scheduler import Scheduler

    log.info(
        "redcrawl: `scrapy %s` runs its requests in this process only, with Scrapy's own "
        "scheduler and dupefilter: no crawl in Redis is read or written",
        command,
    )
    return Scheduler.from_crawler(crawler)


def local_dupefilter(crawler: Crawler, command: str) -> Any:
    """The dupefilter the command has on a plain project: none for ``shell`` (its own
    default, which a project's ``DUPEFILTER_CLASS`` overrides), else Scrapy's."""
    from scrapy.dupefilters import BaseDupeFilter, RFPDupeFilter

    if command == "shell":
        return BaseDupeFilter()
    return RFPDupeFilter.from_crawler(crawler)
