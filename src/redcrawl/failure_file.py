"""The failure file: how a worker of ``redcrawl crawl`` tells its supervisor why it
failed, whatever its log level or where its log goes.

Imported by the supervisor (:mod:`redcrawl.workers`) and by a failing worker
(:func:`redcrawl.scrapy.lifecycle.fail_process`): small, so that a worker failing at
start loads nothing more for it.
"""

from __future__ import annotations

import logging
import os

FAILURE_FILE_ENV = "_REDCRAWL_FAILURE_FILE"
"""The environment variable that gives each worker run the path of its failure file:
a worker that closes with a redcrawl failure writes the reason there, and the
supervisor reads it whatever the log mode. Not a ``REDCRAWL_*`` name: those are
settings, and unknown ones refused."""

log = logging.getLogger(__name__)


def write_failure(reason: str) -> None:
    """Write ``reason`` to the file a supervisor gave this worker
    (:data:`FAILURE_FILE_ENV`), so that it knows whether a restart can cure the failure.
    Best effort: the CRITICAL line and the exit code say it anyway."""
    path = os.environ.get(FAILURE_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(reason + "\n")
    except OSError as exc:
        log.warning("redcrawl: could not write the failure reason to %s: %s", path, exc)
