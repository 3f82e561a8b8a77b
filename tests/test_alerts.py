"""The alert rules in deploy/prometheus: valid (``promtool check rules``), each with a
firing and a not-firing case (``promtool test rules``), and built only from metrics that
``/metrics`` really exports."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import redis
import yaml

from redcrawl.codec import Envelope
from redcrawl.frontier import open_frontier
from redcrawl.metrics.rules import Thresholds
from redcrawl.metrics.rules import rules as rule_list
from redcrawl.settings import Settings

from .apikit import AUTH_READ, ApiServer, api_settings
from .conftest import RedisServer, need

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        need("promtool", "install Debian's prometheus package (scripts/test.sh does)")
    return found


def test_rules_are_valid() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(RULES / "alerts.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 9 rules found" in out.stdout


def test_rules_unit_tests_pass() -> None:
    out = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yml"],
        cwd=RULES,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _rules() -> list[dict[str, str]]:
    doc = yaml.safe_load((RULES / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_rule_has_a_firing_case() -> None:
    tests = yaml.safe_load((RULES / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]
    }
    quiet = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if not case["exp_alerts"]
    }
    names = {rule["alert"] for rule in _rules()}
    assert fired == names and quiet == names


def test_rules_use_only_exported_metrics(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    f = open_frontier(redis7_client, Settings(backend="streams"), "c")
    url = "http://example.com/"
    f.push([Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())])
    f.lease("w1", 1)
    # and a lists crawl with politeness (its politeness series)
    polite = open_frontier(redis7_client, Settings(backend="lists", politeness=True), "p")
    polite.push([Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())])
    server = ApiServer(api_settings(redis7.url), redis7_client)
    try:
        text = httpx.get(f"{server.url}/metrics", headers=AUTH_READ).text
    finally:
        server.stop()
    exported = set(re.findall(r"^(redcrawl_[a-z_]+)", text, re.M))
    used = {name for rule in _rules() for name in re.findall(r"redcrawl_[a-z_]+", rule["expr"])}
    assert used, "no metric found in the rules"
    assert used <= exported, used - exported


def _seconds(text: str) -> float:
    return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


def test_the_watchdog_uses_the_numbers_of_the_rules() -> None:
    t = Thresholds()
    rules = {rule["alert"]: rule for rule in _rules()}

    def check(alert: str, numbers: list[float], windows: list[float], for_: float) -> None:
        expr = rules[alert]["expr"]
        assert [
            float(x) for x in re.findall(r"[<>]=? ?([0-9.]+)(?![0-9.]*[smh]\])", expr) if float(x)
        ] == numbers, (alert, expr)
        assert [_seconds(w) for w in re.findall(r"\[([0-9]+[smh])\]", expr)] == windows, alert
        assert _seconds(rules[alert].get("for", "0s")) == for_, alert
        assert dict(watchdog_for)[alert] == for_, alert

    watchdog_for = [(r.name, r.for_) for r in rule_list(t)]
    check("RedcrawlBacklogHigh", [t.backlog], [t.backlog_window], t.backlog_for)
    check("RedcrawlWorkerHeartbeatLost", [t.heartbeat_lost], [], 0)
    check("RedcrawlCrawlStalled", [], [t.stall_window], t.stall_for)
    check("RedcrawlDeadLettersGrowing", [], [t.dead_window], t.dead_for)
    check("RedcrawlRedisMemoryHigh", [t.memory_ratio], [], t.memory_for)
    check("RedcrawlStreamPendingOld", [t.pending_age], [], 0)
    check(
        "RedcrawlDuplicateItemsHigh",
        [t.duplicate_ratio],
        [t.duplicate_window, t.duplicate_window],
        t.duplicate_for,
    )
    check("RedcrawlPolitenessBlocked", [t.blocked_keys, t.blocked_ratio], [], t.blocked_for)
    check("RedcrawlPartitionsLost", [], [], 0)
    assert set(rules) == {name for name, _f in watchdog_for}
