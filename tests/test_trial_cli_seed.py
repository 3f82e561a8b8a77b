"""An outside tester's findings on ``redcrawl seed -f``: a file that can't be read was a
raw traceback (exit 1), and a ``# comment`` line refused the whole file."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.frontier import ListsFrontier
from redcrawl.settings import Settings

from .conftest import RedisServer

runner = CliRunner()


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda p: p / "missing.txt", "missing.txt: no such file"),
        (lambda p: p, "is a folder"),
        (lambda p: (p / "bin.txt", (p / "bin.txt").write_bytes(b"\xff\xfe"))[0], "not UTF-8"),
    ],
    ids=["missing", "folder", "binary"],
)
def test_an_unreadable_seed_file_is_a_usage_error(
    redis7_client: redis.Redis, redis7: RedisServer, tmp_path: Path, make: object, words: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    result = runner.invoke(
        app, ["seed", "-f", str(path), "--redis-url", redis7.url, "--crawl", "seedf"]
    )
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    out = " ".join(result.output.split())
    assert out.startswith("error: --file ") and words in out, out
    assert "Traceback" not in result.output
    assert not redis7_client.keys("*seedf*")


def test_comments_and_blank_lines_of_a_seed_file_are_skipped(
    redis7_client: redis.Redis, redis7: RedisServer, tmp_path: Path
) -> None:
    listing = tmp_path / "seeds.txt"
    listing.write_text(
        "# start pages\nhttps://a.example/1\n\n   \n\t\n  # indented comment\n"
        "  https://a.example/2  \n"
    )
    result = runner.invoke(
        app, ["seed", "-f", str(listing), "--redis-url", redis7.url, "--crawl", "seedc"]
    )
    assert result.exit_code == 0, result.output
    assert "seeded 2 URL(s)" in result.output
    assert ListsFrontier(redis7_client, Settings(), "seedc").counts().ready == 2
