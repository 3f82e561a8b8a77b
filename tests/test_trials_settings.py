"""Per-site settings a Scrapy 2.19 project writes, as redcrawl reads them (found by trying
redcrawl as a stranger): ``DOWNLOAD_SLOTS`` entries are checked before any worker starts,
and Scrapy's ``DOWNLOAD_DELAY_JITTER`` (which replaces the deprecated
``RANDOMIZE_DOWNLOAD_DELAY``) is honoured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy.settings import Settings as ScrapySettings

from redcrawl import Envelope, open_frontier
from redcrawl.errors import ConfigError
from redcrawl.fingerprint import fingerprint
from redcrawl.settings import Settings

from .conftest import RedisServer
from .sitekit import SITEKIT_FILE
from .test_workers import cli_env


@pytest.mark.parametrize(
    "slots",
    [
        {"example.com": 5},
        {"example.com": {"concurrency": 0}},
        {"example.com": {"concurrency": "2"}},
        {"example.com": {"concurrency": 1.5}},
        {"example.com": {"delay": -1}},
        {"example.com": {"delay": "1"}},
        {"example.com": {"randomize_delay": "no"}},
        {"example.com": {"jitter": -0.1}},
        '{"example.com": 5}',
    ],
)
def test_a_malformed_download_slots_entry_is_refused_naming_the_setting(slots: Any) -> None:
    """Seen before: the settings took any JSON object; a worker then died at start with a
    traceback (an entry that is not a mapping) or the frontier silently used the default
    limits for the site (concurrency 0, a negative or string delay)."""
    with pytest.raises(ConfigError, match=r"DOWNLOAD_SLOTS.*example\.com"):
        Settings.from_mapping({"DOWNLOAD_SLOTS": slots})


def test_well_formed_download_slots_are_kept() -> None:
    slots = {
        "a.example": {"concurrency": 2, "delay": 1.5, "randomize_delay": False},
        "b.example": {"delay": 0},
        "c.example": {},
    }
    assert Settings.from_mapping({"DOWNLOAD_SLOTS": slots}).politeness_slots == slots


def test_a_slots_jitter_becomes_its_randomize_delay() -> None:
    """Scrapy 2.19's ``jitter`` key of a slot (magnitude; 0 for none) is what the frontier
    reads as ``randomize_delay``."""
    slots = {"a.example": {"delay": 1, "jitter": 0}, "b.example": {"delay": 1, "jitter": 0.5}}
    got = Settings.from_mapping({"DOWNLOAD_SLOTS": slots}).politeness_slots
    assert got["a.example"]["randomize_delay"] is False
    assert got["b.example"]["randomize_delay"] is True


def scrapy_settings(project: dict[str, Any], cmdline: dict[str, Any] | None = None) -> Any:
    s = ScrapySettings()
    s.setdict(project, priority="project")
    s.setdict(cmdline or {}, priority="cmdline")
    return s


@pytest.mark.parametrize(
    ("project", "cmdline", "randomize"),
    [
        ({}, {}, True),  # both defaults: ±50%
        ({"DOWNLOAD_DELAY_JITTER": 0}, {}, False),  # seen before: still ±50%
        ({"DOWNLOAD_DELAY_JITTER": 0.25}, {}, True),
        ({"RANDOMIZE_DOWNLOAD_DELAY": False}, {}, False),
        ({"RANDOMIZE_DOWNLOAD_DELAY": False}, {"DOWNLOAD_DELAY_JITTER": 0.5}, True),
        ({"DOWNLOAD_DELAY_JITTER": 0}, {"RANDOMIZE_DOWNLOAD_DELAY": True}, True),
        ({"DOWNLOAD_DELAY_JITTER": 0}, {"REDCRAWL_POLITENESS_RANDOMIZE": True}, True),
    ],
)
def test_download_delay_jitter_is_read_as_scrapy_reads_it(
    project: dict[str, Any], cmdline: dict[str, Any], randomize: bool
) -> None:
    """Scrapy 2.19 deprecates ``RANDOMIZE_DOWNLOAD_DELAY`` for ``DOWNLOAD_DELAY_JITTER``
    (the magnitude, 0 for none) and warns when a project sets the old one, so projects
    move to the new one; the old one wins only when set at a higher priority."""
    settings = Settings.from_scrapy(scrapy_settings(project, cmdline), environ={})
    assert settings.politeness_randomize is randomize


def test_crawl_refuses_a_malformed_download_slots_entry_before_starting_workers(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """``redcrawl crawl -s DOWNLOAD_SLOTS=...`` with an entry that is not a mapping: exit
    2 and a one-line message naming the setting. Seen before: every worker started, died
    with a 30-line traceback each, and the command exited 1."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "redcrawl.cli",
            "crawl",
            str(SITEKIT_FILE),
            "--crawl",
            "trials-slots",
            "--no-progress",
            "--set",
            'DOWNLOAD_SLOTS={"127.0.0.2": 5}',
            "--arg",
            "urls=http://127.0.0.2:9/",
        ],
        cwd=tmp_path,
        env=cli_env(redis7.url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "DOWNLOAD_SLOTS" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / ".redcrawl" / "logs").exists(), "workers were started"


@pytest.mark.parametrize(
    "setting",
    ["REDCRAWL_POLITENESS=off", "REDCRAWL_POLITENESS_KEY=domain", "REDCRAWL_ORDERING=lifo"],
)
def test_crawl_refuses_settings_the_crawl_was_not_created_with(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path, setting: str
) -> None:
    """A polite crawl with work left, run again with a setting that fixes the crawl's
    layout changed (e.g. politeness turned off to go faster): exit 2 before any worker
    starts, naming the setting, nothing lost. Seen before: every worker died at start with
    a traceback ("crawl layout mismatch"), the command exited 1 after their restarts, and
    it said the crawl was finished (it read the per-site queues as empty tier lists)."""
    crawl = "trials-layout"
    frontier = open_frontier(redis7_client, Settings(), crawl)
    urls = [f"http://127.0.0.2:9/p/{i}" for i in range(5)]
    frontier.push([Envelope(url=u, fingerprint=fingerprint(u)) for u in urls])
    before = frontier.counts()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "redcrawl.cli",
            "crawl",
            str(SITEKIT_FILE),
            "--crawl",
            crawl,
            "--no-progress",
            "--set",
            setting,
            "--arg",
            "urls=http://127.0.0.2:9/",
        ],
        cwd=tmp_path,
        env=cli_env(redis7.url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert setting.split("=")[0] in err and "Traceback" not in err, err
    assert "is finished" not in err, err
    assert not (tmp_path / ".redcrawl" / "logs").exists(), "workers were started"
    assert frontier.counts() == before


@pytest.mark.parametrize(
    ("values", "randomize"),
    [
        ({"DOWNLOAD_DELAY_JITTER": "0"}, False),
        ({"DOWNLOAD_DELAY_JITTER": "0.5"}, True),
        ({"DOWNLOAD_DELAY_JITTER": 0, "RANDOMIZE_DOWNLOAD_DELAY": True}, False),
        ({"DOWNLOAD_DELAY_JITTER": 0, "REDCRAWL_POLITENESS_RANDOMIZE": True}, True),
    ],
)
def test_download_delay_jitter_in_a_mapping(values: dict[str, Any], randomize: bool) -> None:
    """``redcrawl crawl --set DOWNLOAD_DELAY_JITTER=0``: the command's own reading (its
    per-site limits line) agrees with its workers'. Seen before: "(±50%)" printed while
    the workers kept exact gaps."""
    assert Settings.from_mapping(values).politeness_randomize is randomize
