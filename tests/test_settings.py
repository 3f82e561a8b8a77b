"""Settings: defaults, scrapy-redis aliases, precedence, validation, derived values."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings as ScrapySettings

import redcrawl.settings as settings_mod
from redcrawl.errors import ConfigError
from redcrawl.settings import SETTINGS_DOC, Settings, ignored_setting_reason

from .conftest import need_module


def test_defaults() -> None:
    s = Settings()
    assert s.redis_url is None and s.redis_host is None and s.redis_port == 6379
    assert s.redis_params == {}
    assert s.embedded_dir == Path(".redcrawl")
    assert s.crawl is None and s.key_prefix == "rc"
    assert s.ordering == "fifo"
    assert s.tier_weights == (5, 3, 2) and s.tier_bounds == (1, 0) and s.tiers == 3
    assert s.lease_ttl == 60.0 and s.heartbeat_interval is None and s.heartbeat == 20.0
    assert s.max_attempts == 3 and s.retry_backoff == 1.0 and s.retry_backoff_max == 300.0
    assert s.batch_size == 500
    assert s.persist is True and s.flush_on_start is False and s.idle_before_close == 0.0
    assert s.dupefilter_key is None and s.canonicalize is False
    assert s.canonical_drop_params == ()
    assert s.start_urls_key == "%(name)s:start_urls" and s.start_urls_as_set is False
    assert s.start_urls_batch_size == 16
    assert Settings.from_mapping({}) == s
    assert Settings.from_env({}) == s
    assert s.crawl_name() == "default" and s.crawl_name("spidey") == "spidey"


def test_every_canonical_name_parses() -> None:
    s = Settings.from_mapping(
        {
            "REDCRAWL_REDIS_URL": "redis://h:1/2",
            "REDCRAWL_REDIS_HOST": "ignored-because-url-is-set",
            "REDCRAWL_REDIS_PORT": "6390",
            "REDCRAWL_REDIS_PARAMS": '{"socket_timeout": 3}',
            "REDCRAWL_EMBEDDED_DIR": "~/rc-data",
            "REDCRAWL_CRAWL": "my.crawl:1",
            "REDCRAWL_KEY_PREFIX": "pfx",
            "REDCRAWL_ORDERING": "lifo",
            "REDCRAWL_TIER_WEIGHTS": "4, 1",
            "REDCRAWL_TIER_BOUNDS": "10",
            "REDCRAWL_LEASE_TTL": "12.5",
            "REDCRAWL_HEARTBEAT_INTERVAL": "2",
            "REDCRAWL_MAX_ATTEMPTS": "7",
            "REDCRAWL_RETRY_BACKOFF": "0.5",
            "REDCRAWL_RETRY_BACKOFF_MAX": "60",
            "REDCRAWL_BATCH_SIZE": "250",
            "REDCRAWL_PERSIST": "no",
            "REDCRAWL_FLUSH_ON_START": "yes",
            "REDCRAWL_IDLE_BEFORE_CLOSE": "3",
            "REDCRAWL_DUPEFILTER_KEY": "x:dupefilter",
            "REDCRAWL_CANONICALIZE": "on",
            "REDCRAWL_CANONICAL_DROP_PARAMS": "utm_*, fbclid,,",
            "REDCRAWL_START_URLS_KEY": "%(name)s:start_urls",
            "REDCRAWL_START_URLS_AS_SET": "true",
            "REDCRAWL_START_URLS_BATCH_SIZE": "32",
        }
    )
    assert s.redis_url == "redis://h:1/2"
    assert s.redis_port == 6390 and s.redis_params == {"socket_timeout": 3}
    assert s.embedded_dir == Path("~/rc-data").expanduser()
    assert s.crawl == "my.crawl:1" and s.key_prefix == "pfx" and s.ordering == "lifo"
    assert s.tier_weights == (4, 1) and s.tier_bounds == (10,) and s.tiers == 2
    assert (s.lease_ttl, s.heartbeat_interval, s.heartbeat) == (12.5, 2.0, 2.0)
    assert (s.max_attempts, s.retry_backoff, s.retry_backoff_max) == (7, 0.5, 60.0)
    assert s.batch_size == 250
    assert (s.persist, s.flush_on_start, s.idle_before_close) == (False, True, 3.0)
    assert s.dupefilter_key == "x:dupefilter"
    assert s.canonicalize is True and s.canonical_drop_params == ("utm_*", "fbclid")
    assert s.start_urls_key == "%(name)s:start_urls"
    assert s.start_urls_as_set is True and s.start_urls_batch_size == 32


# --- scrapy-redis aliases -----------------------------------------------------------------


def test_redis_url_alias() -> None:
    assert Settings.from_mapping({"REDIS_URL": "redis://r:7000/3"}).redis_url == "redis://r:7000/3"


@pytest.mark.parametrize(
    "values",
    [
        {"REDIS_HOST": "cache.local", "REDIS_PORT": 6380},
        {"REDIS_PORT": "6380", "REDIS_HOST": "cache.local"},
    ],
)
def test_redis_host_and_port_make_a_url(values: dict[str, Any]) -> None:
    s = Settings.from_mapping(values)
    assert s.redis_url == "redis://cache.local:6380"
    assert (s.redis_host, s.redis_port) == ("cache.local", 6380)


def test_redis_host_alone_uses_default_port_and_url_wins_over_host() -> None:
    assert Settings.from_mapping({"REDIS_HOST": "h"}).redis_url == "redis://h:6379"
    s = Settings.from_mapping({"REDIS_HOST": "h", "REDIS_PORT": 1, "REDIS_URL": "redis://u:2"})
    assert s.redis_url == "redis://u:2"


def test_an_empty_redis_url_is_unset_and_host_and_port_still_count() -> None:
    """scrapy-redis reads an empty REDIS_URL as none (``REDIS_URL = os.environ.get(
    "REDIS_URL", "")`` in a settings.py, ``-s REDIS_URL=``); it used to select the embedded
    Redis and ignore REDIS_HOST / REDIS_PORT: every machine of a fleet on its own Redis."""
    values = {"REDIS_URL": "", "REDIS_HOST": "127.0.0.1", "REDIS_PORT": 6396}
    assert Settings.from_mapping(values).redis_url == "redis://127.0.0.1:6396"
    project = {"REDIS_HOST": "cache.local", "REDIS_PORT": 6380}
    scrapy_settings = ScrapySettings(project, priority="project")
    scrapy_settings.setdict({"REDIS_URL": ""}, priority="cmdline")
    s = Settings.from_scrapy(scrapy_settings, environ={})
    assert s.redis_url == "redis://cache.local:6380"
    assert Settings.from_mapping({"REDIS_URL": ""}).redis_url is None  # still the embedded one


@pytest.mark.parametrize(
    "params", [{"socket_timeout": 5, "db": 2}, '{"socket_timeout": 5, "db": 2}']
)
def test_redis_params_dict_or_json(params: Any) -> None:
    s = Settings.from_mapping({"REDIS_PARAMS": params})
    assert s.redis_params == {"socket_timeout": 5}
    assert s.redis_db == 2  # REDIS_PARAMS' db counts as REDIS_DB, as in scrapy-redis


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        ("True", True),
        ("false", False),
        (1, True),
        (0, False),
        ("1", True),
        ("0", False),
        ("off", False),
        ("", False),
    ],
)
def test_scheduler_persist_alias(value: Any, expected: bool) -> None:
    assert Settings.from_mapping({"SCHEDULER_PERSIST": value}).persist is expected


def test_scheduler_flush_and_idle_aliases() -> None:
    s = Settings.from_mapping({"SCHEDULER_FLUSH_ON_START": True, "SCHEDULER_IDLE_BEFORE_CLOSE": 10})
    assert s.flush_on_start is True and s.idle_before_close == 10.0
    assert Settings.from_mapping({"SCHEDULER_IDLE_BEFORE_CLOSE": "2.5"}).idle_before_close == 2.5


QUEUES = {
    "PriorityQueue": "priority",
    "FifoQueue": "fifo",
    "SpiderQueue": "fifo",
    "LifoQueue": "lifo",
    "SpiderStack": "lifo",
}


@pytest.mark.parametrize(("cls", "ordering"), QUEUES.items())
def test_scheduler_queue_class_by_name(cls: str, ordering: str) -> None:
    s = Settings.from_mapping({"SCHEDULER_QUEUE_CLASS": f"scrapy_redis.queue.{cls}"})
    assert s.ordering == ordering
    assert s.tiers == (1 if ordering == "priority" else 3)


@pytest.mark.parametrize(("cls", "ordering"), QUEUES.items())
def test_scheduler_queue_class_as_class_object(cls: str, ordering: str) -> None:
    queue = need_module("scrapy_redis.queue", "pip install scrapy-redis==0.9.1")
    s = Settings.from_mapping({"SCHEDULER_QUEUE_CLASS": getattr(queue, cls)})
    assert s.ordering == ordering


def test_unknown_queue_class_is_config_error() -> None:
    with pytest.raises(ConfigError, match="SCHEDULER_QUEUE_CLASS"):
        Settings.from_mapping({"SCHEDULER_QUEUE_CLASS": "myproject.queue.MyQueue"})
    with pytest.raises(ConfigError, match="SCHEDULER_QUEUE_CLASS"):
        Settings.from_mapping({"SCHEDULER_QUEUE_CLASS": ScrapySettings})


def test_scheduler_queue_key_template_gives_crawl_name() -> None:
    s = Settings.from_mapping({"SCHEDULER_QUEUE_KEY": "%(spider)s:requests"})
    assert s.crawl == "%(spider)s:requests"
    assert s.crawl_name("myspider") == "myspider"
    assert s.crawl_name() == "default"
    s = Settings.from_mapping({"SCHEDULER_QUEUE_KEY": "proj-%(spider)s"})
    assert s.crawl_name("myspider") == "proj-myspider"
    # A template that expands to a bad name is caught when expanded.
    with pytest.raises(ConfigError, match="REDCRAWL_CRAWL"):
        Settings(crawl="%(spider)s{x}").crawl_name("a")
    with pytest.raises(ConfigError, match="REDCRAWL_CRAWL"):
        Settings(crawl="%(nope)s").crawl_name("a")


def test_plain_crawl_name_ignores_spider() -> None:
    assert Settings(crawl="shared").crawl_name("myspider") == "shared"


def test_dupefilter_key_alias_and_ignored_scrapy_redis_names() -> None:
    s = Settings.from_mapping(
        {
            "SCHEDULER_DUPEFILTER_KEY": "%(spider)s:dupefilter",
            "SCHEDULER_SERIALIZER": "pickle",
            "SCHEDULER_DUPEFILTER_CLASS": "x.Y",
            "DOWNLOAD_DELAY": 3,
        }
    )
    assert s.dupefilter_key == "%(spider)s:dupefilter"
    # DOWNLOAD_DELAY is read: the fleet-wide politeness delay
    assert s == Settings(dupefilter_key="%(spider)s:dupefilter", politeness_delay=3.0)
    assert "pickle" in (ignored_setting_reason("SCHEDULER_SERIALIZER") or "")
    assert ignored_setting_reason("REDIS_URL") is None


def test_start_urls_aliases() -> None:
    s = Settings.from_mapping(
        {
            "REDIS_START_URLS_KEY": "%(name)s:urls",
            "REDIS_START_URLS_AS_SET": "1",
            "REDIS_START_URLS_BATCH_SIZE": "64",
        }
    )
    assert (s.start_urls_key, s.start_urls_as_set, s.start_urls_batch_size) == (
        "%(name)s:urls",
        True,
        64,
    )


@pytest.mark.parametrize(
    ("alias", "canonical", "alias_value", "canonical_value", "field"),
    [
        ("REDIS_URL", "REDCRAWL_REDIS_URL", "redis://alias:1", "redis://canon:2", "redis_url"),
        ("SCHEDULER_PERSIST", "REDCRAWL_PERSIST", True, False, "persist"),
        (
            "SCHEDULER_QUEUE_CLASS",
            "REDCRAWL_ORDERING",
            "scrapy_redis.queue.LifoQueue",
            "priority",
            "ordering",
        ),
        ("SCHEDULER_IDLE_BEFORE_CLOSE", "REDCRAWL_IDLE_BEFORE_CLOSE", 9, 4, "idle_before_close"),
        ("SCHEDULER_QUEUE_KEY", "REDCRAWL_CRAWL", "%(spider)s:requests", "canon", "crawl"),
    ],
)
@pytest.mark.parametrize("canonical_first", [True, False])
def test_canonical_name_wins_over_alias_in_any_order(
    alias: str,
    canonical: str,
    alias_value: Any,
    canonical_value: Any,
    field: str,
    canonical_first: bool,
) -> None:
    pairs = [(canonical, canonical_value), (alias, alias_value)]
    if not canonical_first:
        pairs.reverse()
    s = Settings.from_mapping(dict(pairs))
    assert getattr(s, field) == getattr(Settings.from_mapping({canonical: canonical_value}), field)
    assert getattr(s, field) != getattr(Settings.from_mapping({alias: alias_value}), field)


def test_none_values_are_skipped() -> None:
    assert Settings.from_mapping({"REDIS_URL": None, "SCHEDULER_PERSIST": None}) == Settings()


# --- validation -----------------------------------------------------------------------


def test_unknown_redcrawl_name_is_config_error() -> None:
    with pytest.raises(ConfigError, match="REDCRAWL_FOO") as info:
        Settings.from_mapping({"REDCRAWL_FOO": "1"})
    assert info.value.setting == "REDCRAWL_FOO"
    assert "docs/settings.md" in str(info.value)  # says where the known names are
    with pytest.raises(ConfigError, match="did you mean REDCRAWL_LEASE_TTL"):
        Settings.from_mapping({"REDCRAWL_LEASE_TTLL": "5"})
    with pytest.raises(ConfigError, match="REDCRAWL_FOO"):
        Settings.from_env({"REDCRAWL_FOO": "1"})
    assert Settings.from_mapping({"REDCRAWL_FOO": "1"}, strict_prefix=False) == Settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REDCRAWL_MAX_ATTEMPTS", "abc"),
        ("REDCRAWL_MAX_ATTEMPTS", "0"),
        ("REDCRAWL_MAX_ATTEMPTS", "1001"),
        ("REDCRAWL_MAX_ATTEMPTS", "2.5"),
        ("REDCRAWL_MAX_ATTEMPTS", True),
        ("REDCRAWL_LEASE_TTL", "-1"),
        ("REDCRAWL_LEASE_TTL", "0"),
        ("REDCRAWL_LEASE_TTL", "soon"),
        ("REDCRAWL_HEARTBEAT_INTERVAL", "0"),
        ("REDCRAWL_RETRY_BACKOFF", "-0.1"),
        ("REDCRAWL_BATCH_SIZE", "0"),
        ("REDCRAWL_BATCH_SIZE", "10001"),
        ("REDCRAWL_REDIS_PORT", "0"),
        ("REDCRAWL_REDIS_PORT", "70000"),
        ("REDCRAWL_PERSIST", "maybe"),
        ("REDCRAWL_PERSIST", 2),
        ("REDCRAWL_CANONICALIZE", "si"),
        ("REDCRAWL_TIER_BOUNDS", "0,1"),
        ("REDCRAWL_TIER_BOUNDS", "1,1"),
        ("REDCRAWL_TIER_BOUNDS", "1"),
        ("REDCRAWL_TIER_BOUNDS", "3,2,1"),
        ("REDCRAWL_TIER_BOUNDS", "a,b"),
        ("REDCRAWL_TIER_WEIGHTS", "5,0,2"),
        ("REDCRAWL_TIER_WEIGHTS", ""),
        ("REDCRAWL_TIER_WEIGHTS", ",".join(["1"] * 17)),
        ("REDCRAWL_ORDERING", "random"),
        ("REDCRAWL_CRAWL", "a{b}"),
        ("REDCRAWL_CRAWL", "{tag}"),
        ("REDCRAWL_CRAWL", "-starts-with-dash"),
        ("REDCRAWL_CRAWL", "x" * 129),
        ("REDCRAWL_CRAWL", "has space"),
        ("REDCRAWL_REDIS_PARAMS", "{not json"),
        ("REDCRAWL_REDIS_PARAMS", "[1, 2]"),
        ("REDCRAWL_REDIS_URL", 5),
        ("REDCRAWL_KEY_PREFIX", 5),
    ],
)
def test_bad_value_is_config_error_naming_the_setting(name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_mapping({name: value})
    assert name in str(info.value)
    assert info.value.setting == name


@pytest.mark.parametrize(
    ("alias", "value"),
    [("REDIS_PORT", "http"), ("SCHEDULER_PERSIST", "?"), ("SCHEDULER_IDLE_BEFORE_CLOSE", "-5")],
)
def test_bad_alias_value_names_the_alias(alias: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=alias):
        Settings.from_mapping({alias: value})


@pytest.mark.parametrize(
    "name", ["REDCRAWL_LEASE_TTL", "REDCRAWL_RETRY_BACKOFF", "REDCRAWL_IDLE_BEFORE_CLOSE"]
)
def test_nan_is_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_mapping({name: "nan"})


def test_priority_ordering_ignores_tier_bounds() -> None:
    s = Settings.from_mapping({"REDCRAWL_ORDERING": "priority", "REDCRAWL_TIER_BOUNDS": "0,5,9"})
    assert s.ordering == "priority" and s.tiers == 1


def test_heartbeat_default_and_must_be_shorter_than_lease() -> None:
    assert Settings(lease_ttl=9.0).heartbeat == 3.0
    assert Settings(lease_ttl=9.0, heartbeat_interval=1.5).heartbeat == 1.5
    for hb in (9.0, 12.0):
        with pytest.raises(ConfigError, match="REDCRAWL_HEARTBEAT_INTERVAL"):
            Settings(lease_ttl=9.0, heartbeat_interval=hb)
    with pytest.raises(ConfigError, match="REDCRAWL_HEARTBEAT_INTERVAL"):
        Settings.from_mapping({"REDCRAWL_LEASE_TTL": "5", "REDCRAWL_HEARTBEAT_INTERVAL": "5"})
    # Lowering the lease below an existing heartbeat is caught as well.
    base = Settings(heartbeat_interval=20.0)
    with pytest.raises(ConfigError, match="REDCRAWL_HEARTBEAT_INTERVAL"):
        Settings.from_env({"REDCRAWL_LEASE_TTL": "10"}, base=base)


# --- builders and precedence ----------------------------------------------------------


def test_from_env_overlays_env_on_base() -> None:
    base = Settings(redis_url="redis://base:1", max_attempts=5, persist=False, crawl="basecrawl")
    s = Settings.from_env(
        {
            "REDCRAWL_MAX_ATTEMPTS": "9",
            "REDCRAWL_PERSIST": "1",
            "REDIS_URL": "redis://not-a-redcrawl-name:1",
            "PATH": "/bin",
        },
        base=base,
    )
    assert s.max_attempts == 9 and s.persist is True
    assert s.redis_url == "redis://base:1" and s.crawl == "basecrawl"
    assert base.max_attempts == 5  # the base is untouched


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDCRAWL_BATCH_SIZE", "17")
    assert Settings.from_env().batch_size == 17
    monkeypatch.setenv("REDCRAWL_BATCH_SIZZE", "17")
    with pytest.raises(ConfigError, match="REDCRAWL_BATCH_SIZZE"):
        Settings.from_env()


def test_from_env_host_recomputes_url() -> None:
    base = Settings.from_mapping({"REDIS_HOST": "scrapy-host", "REDIS_PORT": 7001})
    assert base.redis_url == "redis://scrapy-host:7001"
    s = Settings.from_env({"REDCRAWL_REDIS_HOST": "env-host"}, base=base)
    assert s.redis_url == "redis://env-host:7001"


def test_from_scrapy_with_real_scrapy_settings() -> None:
    scrapy_settings = ScrapySettings(
        {
            "REDIS_URL": "redis://scrapy:6379/1",
            "SCHEDULER_PERSIST": False,
            "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue",
            "SCHEDULER_QUEUE_KEY": "%(spider)s:requests",
            "REDIS_PARAMS": {"socket_timeout": 30},
            "REDCRAWL_MAX_ATTEMPTS": 4,
            "REDCRAWL_LEASE_TTL": 30,
            "BOT_NAME": "bot",
        }
    )
    s = Settings.from_scrapy(scrapy_settings, environ={})
    assert s.redis_url == "redis://scrapy:6379/1"
    assert s.persist is False and s.ordering == "priority"
    assert s.crawl_name("spidey") == "spidey"
    assert s.redis_params == {"socket_timeout": 30}
    assert s.max_attempts == 4 and s.lease_ttl == 30.0

    env = {
        "REDCRAWL_REDIS_URL": "redis://env:6379/2",
        "REDCRAWL_PERSIST": "true",
        "REDCRAWL_MAX_ATTEMPTS": "8",
        "REDCRAWL_ORDERING": "lifo",
    }
    s = Settings.from_scrapy(scrapy_settings, environ=env)
    assert s.redis_url == "redis://env:6379/2"
    assert s.persist is True and s.max_attempts == 8 and s.ordering == "lifo"
    assert s.lease_ttl == 30.0  # not in env: scrapy's value stays


def test_from_scrapy_canonical_name_wins_and_unknown_name_fails() -> None:
    s = Settings.from_scrapy(
        ScrapySettings({"SCHEDULER_PERSIST": False, "REDCRAWL_PERSIST": True}), environ={}
    )
    assert s.persist is True
    s = Settings.from_scrapy(
        ScrapySettings({"REDCRAWL_PERSIST": True, "SCHEDULER_PERSIST": False}), environ={}
    )
    assert s.persist is True
    with pytest.raises(ConfigError, match="REDCRAWL_TYPO"):
        Settings.from_scrapy(ScrapySettings({"REDCRAWL_TYPO": 1}), environ={})
    with pytest.raises(ConfigError, match="SCHEDULER_PERSIST"):
        Settings.from_scrapy(ScrapySettings({"SCHEDULER_PERSIST": "perhaps"}), environ={})


def test_from_scrapy_accepts_a_plain_dict() -> None:
    s = Settings.from_scrapy({"REDIS_HOST": "h", "REDIS_PORT": 1234}, environ={})
    assert s.redis_url == "redis://h:1234"


def test_from_scrapy_defaults_when_nothing_set() -> None:
    assert Settings.from_scrapy(ScrapySettings(), environ={}) == Settings()


def test_replace_validates_and_rejects_unknown_fields() -> None:
    s = Settings()
    t = s.replace(max_attempts=5, crawl="other")
    assert (t.max_attempts, t.crawl) == (5, "other") and s.max_attempts == 3
    with pytest.raises(ConfigError, match="bogus"):
        s.replace(bogus=1)
    with pytest.raises(ConfigError, match="REDCRAWL_HEARTBEAT_INTERVAL"):
        s.replace(heartbeat_interval=60.0)
    with pytest.raises(ConfigError, match="REDCRAWL_TIER_BOUNDS"):
        s.replace(tier_bounds=(0, 1))
    with pytest.raises(ConfigError, match="REDCRAWL_CRAWL"):
        s.replace(crawl="a{b}")
    with pytest.raises(ConfigError, match="REDCRAWL_TIER_WEIGHTS"):
        s.replace(tier_weights=(1, -1, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_attempts = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "name"),
    [
        ("max_attempts", 0, "REDCRAWL_MAX_ATTEMPTS"),
        ("lease_ttl", -1.0, "REDCRAWL_LEASE_TTL"),
        ("ordering", "random", "REDCRAWL_ORDERING"),
        ("batch_size", 0, "REDCRAWL_BATCH_SIZE"),
    ],
)
def test_replace_rejects_out_of_range_values(field: str, value: Any, name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings().replace(**{field: value})


# --- derived values ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "tier"),
    [
        (1_000_000, 0),
        (5, 0),
        (1, 0),
        (0, 1),
        (-1, 2),
        (-1_000_000, 2),
    ],
)
def test_tier_of_default_bounds(priority: int, tier: int) -> None:
    assert Settings().tier_of(priority) == tier


def test_tier_of_custom_bounds() -> None:
    s = Settings(tier_weights=(1, 1, 1, 1), tier_bounds=(100, 10, -10))
    assert [s.tier_of(p) for p in (500, 100, 99, 10, 0, -10, -11)] == [0, 0, 1, 1, 2, 2, 3]
    one = Settings(tier_weights=(1,), tier_bounds=())
    assert one.tiers == 1 and {one.tier_of(p) for p in (-5, 0, 5)} == {0}


def test_tier_of_stays_within_tiers_for_priority_ordering() -> None:
    s = Settings(ordering="priority")
    assert all(0 <= s.tier_of(p) < s.tiers for p in (5, 0, -5))


def test_retry_delay() -> None:
    s = Settings(retry_backoff=1.0, retry_backoff_max=300.0)
    assert [s.retry_delay(a) for a in (0, 1, 2, 3, 4, 9)] == [1.0, 1.0, 2.0, 4.0, 8.0, 256.0]
    assert s.retry_delay(10) == 300.0 and s.retry_delay(1000) == 300.0
    assert Settings(retry_backoff=0.25, retry_backoff_max=1.0).retry_delay(3) == 1.0
    assert Settings(retry_backoff=0.25, retry_backoff_max=10.0).retry_delay(3) == 1.0
    assert Settings(retry_backoff=0.0).retry_delay(5) == 0.0
    assert Settings(retry_backoff=2.0, retry_backoff_max=0.0).retry_delay(1) == 0.0
    assert all(not math.isnan(s.retry_delay(a)) for a in range(1, 1001))


def test_settings_doc_lists_every_field_once() -> None:
    fields = [f.name for f in dataclasses.fields(Settings)]
    names = [row[0] for row in SETTINGS_DOC]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(f"REDCRAWL_{f.upper()}" for f in fields)
    defaults = Settings()
    for name, aliases, default, doc in SETTINGS_DOC:
        field = name.removeprefix("REDCRAWL_").lower()
        value = getattr(defaults, field)
        assert default == ("unset" if value is None else settings_mod._show(value))
        assert doc.strip()
        for alias in filter(None, aliases.split(", ")):
            assert alias not in names
    all_aliases = {a for row in SETTINGS_DOC for a in row[1].split(", ") if a}
    assert {
        "REDIS_URL",
        "REDIS_HOST",
        "REDIS_PORT",
        "REDIS_PARAMS",
        "SCHEDULER_PERSIST",
        "SCHEDULER_FLUSH_ON_START",
        "SCHEDULER_IDLE_BEFORE_CLOSE",
        "SCHEDULER_QUEUE_CLASS",
        "SCHEDULER_QUEUE_KEY",
        "SCHEDULER_DUPEFILTER_KEY",
    } <= all_aliases


# --- scrapy-redis's connection settings, as scrapy-redis reads them (issue 10 item 6) -----


@pytest.mark.parametrize(
    ("values", "url"),
    [
        ({"REDIS_PORT": 6390}, "redis://localhost:6390"),
        ({"REDIS_PORT": "6390"}, "redis://localhost:6390"),
        ({"REDIS_DB": 3}, "redis://localhost:6379/3"),
        ({"REDIS_HOST": "h", "REDIS_DB": "2"}, "redis://h:6379/2"),
        ({"REDIS_HOST": "::1", "REDIS_PORT": 7000}, "redis://[::1]:7000"),
        ({"REDIS_PARAMS": {"host": "p", "port": 7001, "password": "pw"}}, "redis://p:7001"),
        ({"REDIS_PARAMS": {"host": "p", "port": 7001}, "REDIS_HOST": "h"}, "redis://h:7001"),
        ({"REDIS_PARAMS": {"url": "redis://fromparams:1/4"}}, "redis://fromparams:1/4"),
    ],
)
def test_redis_host_port_db_alone_are_honoured(values: dict[str, Any], url: str) -> None:
    s = Settings.from_mapping(values)
    assert s.redis_url == url
    assert not {"host", "port", "url", "db"} & set(s.redis_params)  # moved, not passed on


def test_redis_params_other_keys_stay_client_arguments() -> None:
    s = Settings.from_mapping(
        {"REDIS_PARAMS": {"host": "p", "password": "pw", "socket_timeout": 3}}
    )
    assert s.redis_params == {"password": "pw", "socket_timeout": 3}


def test_redis_url_wins_over_host_and_port_at_any_level() -> None:
    # scrapy-redis: REDIS_URL, when set, is used and REDIS_HOST / REDIS_PORT are not.
    project = Settings.from_mapping({"REDIS_URL": "redis://u:1/0"})
    assert Settings.from_mapping({"REDIS_PORT": 7}, base=project).redis_url == "redis://u:1/0"
    # ... but a URL made from host and port follows a later port or host.
    project = Settings.from_mapping({"REDIS_HOST": "h"})
    assert Settings.from_mapping({"REDIS_PORT": 7}, base=project).redis_url == "redis://h:7"
    assert (
        Settings.from_env({"REDCRAWL_REDIS_HOST": "e"}, base=project).redis_url == "redis://e:6379"
    )


QUEUE_CLASSES_0_9_1 = {
    "PriorityQueue": "priority",
    "SpiderPriorityQueue": "priority",
    "FifoQueue": "fifo",
    "SpiderQueue": "fifo",
    "LifoQueue": "lifo",
    "SpiderStack": "lifo",
}


@pytest.mark.parametrize(("cls", "ordering"), QUEUE_CLASSES_0_9_1.items())
def test_every_scrapy_redis_queue_class_maps(cls: str, ordering: str) -> None:
    queue = need_module("scrapy_redis.queue", "pip install scrapy-redis==0.9.1")
    assert hasattr(queue, cls)  # the table is scrapy-redis 0.9.1's
    assert (
        Settings.from_mapping({"SCHEDULER_QUEUE_CLASS": f"scrapy_redis.queue.{cls}"}).ordering
        == ordering
    )
    assert (
        Settings.from_mapping({"SCHEDULER_QUEUE_CLASS": getattr(queue, cls)}).ordering == ordering
    )


def test_other_queue_classes_are_refused_clearly() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_mapping({"SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.Nope"})
    message = str(info.value)
    assert "SCHEDULER_QUEUE_CLASS" in message and "SpiderPriorityQueue" in message
    assert "is not a queue class of scrapy-redis" in message
    with pytest.raises(ConfigError) as info:
        Settings.from_mapping({"SCHEDULER_QUEUE_CLASS": "myproject.queues.MyQueue"})
    message = str(info.value)
    assert "myproject.queues.MyQueue" in message and "REDCRAWL_ORDERING" in message
    assert "scrapy_redis.queue class" not in message  # no "use one" after "not one"


# --- startup notes (issue 10 items 6 and 7) -----------------------------------------------


def _notes(values: dict[str, Any], environ: dict[str, str] | None = None) -> list[str]:
    return settings_mod.startup_notes(
        ScrapySettings(values, priority="project"), environ=environ or {}
    )


def test_startup_notes_for_a_plain_redcrawl_project_say_nothing() -> None:
    assert (
        _notes(
            {
                "REDCRAWL_REDIS_URL": "redis://h:1",
                "REDCRAWL_ORDERING": "fifo",
                "REDCRAWL_PERSIST": True,
            }
        )
        == []
    )
    assert (
        _notes(
            {},
            {
                "REDCRAWL_REDIS_URL": "redis://h:1",
                "REDCRAWL_ORDERING": "lifo",
                "REDCRAWL_PERSIST": "1",
            },
        )
        == []
    )  # the environment counts too


def test_startup_notes_for_scrapy_redis_defaults_left_out() -> None:
    # a migrated project: scrapy-redis classes swapped, nothing else said
    notes = _notes({"SCHEDULER": "redcrawl.scrapy.Scheduler"})
    joined = "\n".join(notes)
    assert len(notes) == 3, notes
    assert "SCHEDULER_PERSIST" in joined and "scrapy-redis's default is False" in joined
    assert "SCHEDULER_QUEUE_CLASS" in joined and "highest priority first" in joined
    assert "embedded Redis" in joined and "localhost:6379" in joined
    # a plain Scrapy project (quotesbot) gets the same notes: each says what Scrapy itself
    # does too, not only scrapy-redis
    persist, order = notes[0], notes[1]
    assert "Scrapy's own scheduler" in persist, persist
    assert "Scrapy's own scheduler" in order, order


def test_startup_notes_explain_mapped_and_ignored_settings() -> None:
    values = {
        "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.SpiderPriorityQueue",
        "SCHEDULER_PERSIST": True,
        "REDIS_URL": "redis://h:1",
        "SCHEDULER_SERIALIZER": "scrapy_redis.picklecompat",
        "REDIS_ENCODING": "latin-1",
        "REDIS_PARAMS": {"redis_cls": "redis.Redis", "socket_timeout": 3},
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_DUPEFILTER_KEY": "%(spider)s:dupefilter",
    }
    [queue] = _notes(values)  # persistence and Redis given: nothing to say about them
    assert "SpiderPriorityQueue" in queue and "REDCRAWL_ORDERING=priority" in queue
    warnings = settings_mod.startup_warnings(ScrapySettings(values, priority="project"))
    [serializer] = [w for w in warnings if "SCHEDULER_SERIALIZER" in w]
    assert serializer.startswith("ignored") and "msgpack" in serializer
    assert any("REDIS_ENCODING" in w for w in warnings)
    assert any("redis_cls" in w for w in warnings)
    assert any("redcrawl.scrapy.DupeFilter" in w for w in warnings)
    assert any("import-dupefilter" in w for w in warnings)
    assert len(warnings) == 5, warnings
    assert settings_mod.startup_warnings(ScrapySettings({"REDIS_URL": "redis://h:1"})) == []
    # REDIS_PARAMS' redis_cls never reaches redis-py
    assert Settings.from_scrapy(ScrapySettings(values), environ={}).redis_params == {
        "socket_timeout": 3
    }


def test_startup_notes_host_ignored_when_url_set() -> None:
    notes = _notes({"REDIS_URL": "redis://u:1", "REDIS_PORT": 7000})
    assert any("REDIS_PORT" in n and "REDIS_URL" in n for n in notes), notes


# --- precedence: scrapy crawl -s > environment > settings.py (issue 10 item 8) ------------


def test_from_scrapy_cmdline_beats_env_beats_project() -> None:
    s = ScrapySettings({"REDCRAWL_MAX_ATTEMPTS": 2, "REDCRAWL_LEASE_TTL": 30}, priority="project")
    s.set("REDCRAWL_PREFETCH", 7, priority="spider")
    s.setdict({"REDCRAWL_MAX_ATTEMPTS": 4, "SCHEDULER_PERSIST": True}, priority="cmdline")
    env = {
        "REDCRAWL_MAX_ATTEMPTS": "3",
        "REDCRAWL_LEASE_TTL": "45",
        "REDCRAWL_PREFETCH": "9",
        "REDCRAWL_PERSIST": "false",
    }
    r = Settings.from_scrapy(s, environ=env)
    assert r.max_attempts == 4  # -s beats the environment
    assert r.persist is True  # ... under a scrapy-redis name too
    assert r.lease_ttl == 45.0  # the environment beats settings.py
    assert r.prefetch == 9  # ... and the spider's custom_settings


PROJECT_SETTINGS = """
BOT_NAME = "prec"
SPIDER_MODULES = ["prec.spiders"]
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "WARNING"
REDCRAWL_MAX_ATTEMPTS = 2
REDCRAWL_LEASE_TTL = 30
REDCRAWL_BATCH_SIZE = 50
"""

PROJECT_SPIDER = """
import json
import scrapy
from redcrawl.settings import Settings

class Show(scrapy.Spider):
    name = "show"
    custom_settings = {"REDCRAWL_PREFETCH": 7}

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        s = Settings.from_scrapy(crawler.settings)
        print(json.dumps({f: getattr(s, f) for f in
                          ("max_attempts", "lease_ttl", "batch_size", "prefetch")}))
        return super().from_crawler(crawler, *args, **kwargs)

    async def start(self):
        return
        yield

    def start_requests(self):
        return []
"""


def test_scrapy_crawl_dash_s_beats_the_environment(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = prec.settings\n")
    (tmp_path / "prec" / "spiders").mkdir(parents=True)
    (tmp_path / "prec" / "__init__.py").write_text("")
    (tmp_path / "prec" / "settings.py").write_text(PROJECT_SETTINGS)
    (tmp_path / "prec" / "spiders" / "__init__.py").write_text(PROJECT_SPIDER)
    src = Path(__file__).resolve().parent.parent / "src"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDCRAWL_", "SCRAPY_"))}
    env |= {
        "PYTHONPATH": str(src),
        "REDCRAWL_MAX_ATTEMPTS": "3",
        "REDCRAWL_LEASE_TTL": "45",
        "REDCRAWL_PREFETCH": "9",
    }
    result = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "show", "-s", "REDCRAWL_MAX_ATTEMPTS=4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown == {"max_attempts": 4, "lease_ttl": 45.0, "batch_size": 50, "prefetch": 9}


@pytest.mark.parametrize("name", ["REDCRAWL_API_TOKENS", "REDCRAWL_API_ADMIN_TOKENS"])
@pytest.mark.parametrize("value", [",,,", " , ", ","])
def test_a_token_list_that_names_no_token_is_refused(name: str, value: str) -> None:
    """A token setting that is set but names no token (a stray comma, a template that
    filled in nothing) meant no token: `serve` then ran open (on loopback, with a warning)
    where the operator asked for authentication. Empty (unset) is still no token."""
    with pytest.raises(ConfigError, match=name) as exc:
        Settings.from_env({name: value})
    assert "no token" in str(exc.value)
    assert Settings.from_env({name: ""}) == Settings.from_env({})
    good = "g" * 16
    field = name.removeprefix("REDCRAWL_").lower()
    assert getattr(Settings.from_env({name: f"{good},,"}), field) == (good,)
