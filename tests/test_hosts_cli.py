"""``redcrawl hosts``: list, show, set, block, unblock, reset, against a real Redis 7; bad
values exit 2 naming the flag, a crawl without politeness exits 1 saying what to do."""

from __future__ import annotations

import json
import time

import pytest
import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.cli.hosts import duration
from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.politeness.hosts import BadHostInput
from redcrawl.settings import Settings

from .conftest import RedisServer

runner = CliRunner()


def hosts(redis7: RedisServer, *args: str, crawl: str = "cli") -> tuple[int, str]:
    result = runner.invoke(app, ["hosts", *args, "--redis-url", redis7.url, "--crawl", crawl])
    return result.exit_code, result.output


def site(host: str, n: int) -> list[Envelope]:
    return [
        Envelope(url=f"http://{host}/p{i}", fingerprint=fingerprint(f"http://{host}/p{i}"))
        for i in range(n)
    ]


@pytest.fixture
def crawl(redis7_client: redis.Redis) -> FrontierCore:
    s = Settings(politeness_concurrency=2, politeness_delay=0.0, politeness_randomize=False)
    f = open_frontier(redis7_client, s, "cli")
    f.push(site("a.test", 4) + site("b.test", 1))
    return f


def granted(f: FrontierCore, host: str) -> int:
    return sum(1 for lease in f.lease("w", 100) if lease.envelope.url.split("/")[2] == host)


def test_list_and_show(redis7: RedisServer, crawl: FrontierCore) -> None:
    crawl.lease("w", 1)
    code, out = hosts(redis7)
    assert code == 0, out
    assert out.index("a.test") < out.index("b.test") and "2 keys read" in out
    code, out = hosts(redis7, "--sort", "inflight", "--top", "1", "--json")
    assert code == 0, out
    page = json.loads(out)
    assert len(page["hosts"]) == 1 and page["hosts"][0]["in_flight"] == 1
    assert page["next_cursor"] == "1" and page["complete"]
    code, out = hosts(redis7, "--top", "1", "--cursor", "1", "--json")
    assert code == 0 and len(json.loads(out)["hosts"]) == 1
    code, out = hosts(redis7, "show", "a.test")
    assert code == 0, out
    assert "concurrency" in out and "2 (default)" in out and "served now?" in out
    code, out = hosts(redis7, "show", "a.test", "--json")
    d = json.loads(out)
    assert (d["key"], d["ready"], d["concurrency"]["source"]) == (
        "a.test",
        4 - d["in_flight"],
        "default",
    )


def test_set_block_unblock_reset_steer_the_lease(redis7: RedisServer, crawl: FrontierCore) -> None:
    code, out = hosts(redis7, "set", "a.test", "--delay", "0", "--concurrency", "1", "--json")
    assert code == 0, out
    assert json.loads(out)["override"] == {"delay": 0.0, "concurrency": 1}
    assert granted(crawl, "a.test") == 1
    code, out = hosts(redis7, "set", "a.test", "--concurrency", "3")
    assert code == 0 and "3 (override)" in out
    code, out = hosts(redis7, "block", "a.test", "--for", "10m", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["block_until"] == pytest.approx(time.time() + 600, abs=30)
    assert d["why"].startswith("blocked by operator until ")
    assert granted(crawl, "a.test") == 0
    code, out = hosts(redis7, "unblock", "a.test")
    assert code == 0 and "blocked by operator" not in out
    assert granted(crawl, "a.test") == 2
    code, out = hosts(redis7, "set", "a.test", "--pause")
    assert code == 0 and "paused by operator" in out
    code, out = hosts(redis7, "set", "a.test", "--resume", "--json")
    assert code == 0 and not json.loads(out)["paused"]
    code, out = hosts(redis7, "reset", "a.test", "--json")
    assert code == 0 and json.loads(out)["override"] == {}
    assert crawl.client.hget(crawl.keys.pol_override, "a.test") is None


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["set", "a.test", "--delay", "-1"], "--delay"),
        (["set", "a.test", "--delay", "nan"], "--delay"),
        (["set", "a.test", "--delay", "inf"], "--delay"),
        (["set", "a.test", "--delay", "100000"], "--delay"),
        (["set", "a.test", "--concurrency", "0"], "--concurrency"),
        (["set", "a.test", "--concurrency", "-3"], "--concurrency"),
        (["set", "a.test", "--concurrency", "10001"], "--concurrency"),
        (["set", "a.test"], "--delay, --concurrency"),
        (["block", "a.test", "--for", "0s"], "--for"),
        (["block", "a.test", "--for", "31d"], "--for"),
        (["block", "a.test", "--for", "soon"], "--for"),
        (["block", "a.test", "--for", "-5m"], "--for"),
        (["show", ""], "KEY"),
        (["set", "x" * 300, "--delay", "1"], "KEY"),
        (["--sort", "name"], "--sort"),
        (["--top", "0"], "--top"),
        (["--cursor", "x"], "cursor"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(
    redis7: RedisServer, crawl: FrontierCore, args: list[str], flag: str
) -> None:
    code, out = hosts(redis7, *args)
    assert code == 2, out
    assert flag in out, out
    assert crawl.client.hget(crawl.keys.pol_override, "a.test") is None


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["set", "a.test", "--delay", "-1"], "--delay"),
        (["set", "a.test", "--concurrency", "0"], "--concurrency"),
        (["block", "a.test", "--for", "31d"], "--for"),
        (["show", ""], "KEY"),
    ],
)
def test_bad_input_is_refused_before_redis_is_asked(args: list[str], flag: str) -> None:
    """A bad value gets its exit 2 naming the flag whatever the crawl and the Redis: not a
    'no crawl named' (exit 1) or 'cannot reach Redis' (exit 3) that hides it."""
    url = "redis://127.0.0.1:1/0"  # (nothing listens on port 1)
    result = runner.invoke(app, ["hosts", *args, "--redis-url", url, "--crawl", "nope"])
    assert result.exit_code == 2, result.output
    assert flag in result.output, result.output


def test_a_block_too_long_is_told_in_the_units_given() -> None:
    with pytest.raises(BadHostInput) as e:
        duration("31d")
    assert "31d" in e.value.problem and "30d" in e.value.problem, e.value.problem
    with pytest.raises(BadHostInput) as e:
        duration("0.5ms")
    assert "1ms" in e.value.problem, e.value.problem


def test_typer_refuses_what_is_not_a_number(redis7: RedisServer, crawl: FrontierCore) -> None:
    code, out = hosts(redis7, "set", "a.test", "--concurrency", "1.5")
    assert code == 2 and "--concurrency" in out


@pytest.mark.parametrize(
    "changes", [{"politeness": False}, {"backend": "streams", "politeness": False}]
)
def test_a_crawl_without_politeness(
    redis7: RedisServer, redis7_client: redis.Redis, changes: dict[str, object]
) -> None:
    open_frontier(redis7_client, Settings(**changes), "old").push(site("a.test", 1))  # type: ignore[arg-type]
    for args in (["show", "a.test"], ["set", "a.test", "--delay", "1"], []):
        code, out = hosts(redis7, *args, crawl="old")
        assert code == 1, out
        assert "no fleet-wide politeness" in out and "new crawl name" in out


def test_unknown_crawl(redis7: RedisServer, crawl: FrontierCore) -> None:
    code, out = hosts(redis7, crawl="nope")
    assert code == 1 and "no crawl named 'nope'" in out


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("10m", 600),
        ("10min", 600),
        ("1.5h", 5400),
        ("2d", 172800),
        ("500ms", 0.5),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "m", "10y", "-1s", "1e3s", "ten"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(BadHostInput):
        duration(text)


def test_flags_before_the_subcommand(redis7: RedisServer, crawl: FrontierCore) -> None:
    args = ["hosts", "--redis-url", redis7.url, "--crawl", "cli", "show", "b.test", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["key"] == "b.test"
