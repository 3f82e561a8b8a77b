"""``redcrawl crawl -o FILE`` / ``-O FILE``: Scrapy's feed options, one file per worker.

N worker processes cannot write one feed file at once (each buffers its own writes: lines
of two workers would interleave mid-item), so worker ``w<i>`` writes ``FILE`` with
``.w<i>`` put before its extension: ``items.jsonl`` gives ``items.w0.jsonl``,
``items.w1.jsonl``... A ``:FORMAT`` suffix is kept as Scrapy reads it
(``items.json:jsonlines`` gives ``items.w0.json:jsonlines``). Workers always append: a
worker restarted after a crash, or a crawl resumed, adds to its file and loses nothing
(line formats such as ``.jsonl`` and ``.csv`` stay readable; a ``.json`` array appended to
is not valid JSON, as with ``scrapy crawl -o``). ``-O`` removes the files of an earlier
run first (every ``FILE`` part of any worker number), once, before any worker starts.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["WORKER_TOKEN", "for_worker", "output_problem", "per_worker", "remove_parts"]

WORKER_TOKEN = "{redcrawl-worker}"
"""Stands for the worker's name (``w0``, ``w1``...) in a worker's command line: the
supervisor puts the name in when it starts the worker (:class:`redcrawl.workers.Fleet`)."""

_FORMAT = re.compile(r"[A-Za-z0-9_]+")


def _split(output: str) -> tuple[str, str]:
    """``(uri, ":FORMAT" or "")``, as Scrapy's ``-o`` reads a trailing ``:FORMAT``."""
    uri, sep, fmt = output.rpartition(":")
    if sep and uri and _FORMAT.fullmatch(fmt):
        return uri, sep + fmt
    return output, ""


def output_problem(output: str) -> str | None:
    """What is wrong with an output the workers cannot each have a file of (standard
    output; a file with neither an extension nor a format), with the fix; None if fine."""
    uri, fmt = _split(output)
    if uri in ("-", "stdout:") or output.startswith("stdout:"):
        return (
            f"{output!r}: the workers' standard output goes to their logs; give a file, "
            "e.g. items.jsonl (each worker writes its own: items.w0.jsonl, ...)"
        )
    name = uri.rstrip("/").rpartition("/")[2]
    stem, dot, ext = name.rpartition(".")
    if not fmt and not (dot and stem and ext):
        return (
            f"{output!r}: give the file an extension that names its format (items.jsonl, "
            "items.csv, items.json, items.xml) or add one after a colon (items:jsonlines)"
        )
    return None


def per_worker(output: str) -> str:
    """``output`` with :data:`WORKER_TOKEN` put before its extension (after its name
    when it has none)."""
    uri, fmt = _split(output)
    head, slash, name = uri.rpartition("/")
    stem, dot, ext = name.rpartition(".")
    name = f"{stem}.{WORKER_TOKEN}.{ext}" if dot and stem else f"{name}.{WORKER_TOKEN}"
    return f"{head}{slash}{name}{fmt}"


def for_worker(output: str, worker: str) -> str:
    """The file worker ``worker`` (``w0``...) writes for ``output``."""
    return per_worker(output).replace(WORKER_TOKEN, worker)


def _local(uri: str, cwd: Path) -> Path | None:
    """The local path of a feed URI (a plain path or ``file://``), else None."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return Path(parts.path)
    if parts.scheme and len(parts.scheme) > 1:  # s3://, ftp://... (not a drive letter)
        return None
    return cwd / uri


def remove_parts(output: str, cwd: Path | None = None) -> list[Path]:
    """``-O``: remove the local files any worker wrote for ``output`` (``items.w<N>.jsonl``
    for every N); returns them. Remote feeds (s3://...) are left to Scrapy."""
    uri, _ = _split(output)
    path = _local(uri, cwd or Path.cwd())
    if path is None or not path.parent.is_dir():
        return []
    stem, dot, ext = path.name.rpartition(".")
    if dot and stem:
        pattern = re.compile(rf"{re.escape(stem)}\.w\d+\.{re.escape(ext)}")
    else:
        pattern = re.compile(rf"{re.escape(path.name)}\.w\d+")
    removed = []
    for part in sorted(path.parent.iterdir()):
        if pattern.fullmatch(part.name) and part.is_file():
            part.unlink()
            removed.append(part)
    return removed
