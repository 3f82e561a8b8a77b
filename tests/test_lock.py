"""CrawlLock: a token-owned lock, on real Redis servers (7.x and 6.2)."""

from __future__ import annotations

import threading
import time

import pytest
import redis
import redis.exceptions
import redis.lock

from redcrawl.errors import LockError
from redcrawl.keys import CrawlKeys
from redcrawl.lock import CrawlLock

KEYS = CrawlKeys("c")
KEY = "rc:{c}:lock:flush"


def make(client: redis.Redis, ttl: float = 30.0, **kw: float) -> CrawlLock:
    return CrawlLock(client, KEYS, "flush", ttl=ttl, **kw)


def test_lock_key_is_in_the_crawl_slot(redis_client: redis.Redis) -> None:
    assert make(redis_client).key == KEY == KEYS.lock("flush")
    assert CrawlLock(redis_client, CrawlKeys("c", prefix="p"), "x").key == "p:{c}:lock:x"


def test_acquire_and_release(redis_client: redis.Redis) -> None:
    lock = make(redis_client, ttl=30)
    assert not lock.owned()
    assert lock.acquire() is True
    assert lock.acquired and lock.owned()
    assert redis_client.get(KEY) == lock.token.encode()
    assert 0 < redis_client.pttl(KEY) <= 30_000
    assert lock.release() is True
    assert not lock.acquired and not lock.owned()
    assert redis_client.exists(KEY) == 0
    assert lock.release() is False  # releasing twice is harmless
    assert lock.acquire() is True  # and it can be taken again
    lock.release()


def test_owners_have_distinct_tokens(redis_client: redis.Redis) -> None:
    assert make(redis_client).token != make(redis_client).token


def test_second_owner_cannot_acquire_while_held(redis_client: redis.Redis) -> None:
    first, second = make(redis_client), make(redis_client)
    assert first.acquire()
    assert second.acquire() is False
    assert not second.acquired and not second.owned()
    assert redis_client.get(KEY) == first.token.encode()
    assert first.release()
    assert second.acquire() is True
    assert second.owned() and not first.owned()
    second.release()


def test_release_by_non_owner_returns_false_and_keeps_the_lock(redis_client: redis.Redis) -> None:
    owner, other = make(redis_client), make(redis_client)
    assert owner.acquire()
    assert other.release() is False
    assert redis_client.get(KEY) == owner.token.encode()
    assert owner.owned()
    assert owner.release() is True


def test_renew_extends(redis_client: redis.Redis) -> None:
    lock = make(redis_client, ttl=1.0)
    assert lock.acquire()
    assert 0 < redis_client.pttl(KEY) <= 1000
    lock.renew(ttl=60)
    assert 1000 < redis_client.pttl(KEY) <= 60_000
    lock.renew()  # back to the lock's own ttl
    assert 0 < redis_client.pttl(KEY) <= 1000
    assert lock.acquired and lock.owned()
    lock.release()


def test_renew_by_non_owner_is_lock_error_and_does_not_extend(redis_client: redis.Redis) -> None:
    owner, other = make(redis_client, ttl=1.0), make(redis_client)
    assert owner.acquire()
    with pytest.raises(LockError, match="rc:\\{c\\}:lock:flush"):
        other.renew(ttl=60)
    assert redis_client.pttl(KEY) <= 1000
    assert not other.acquired
    owner.release()


def test_renew_after_expiry_is_lock_error(redis_client: redis.Redis) -> None:
    lock = make(redis_client, ttl=0.2)
    assert lock.acquire()
    time.sleep(0.4)
    assert redis_client.exists(KEY) == 0
    with pytest.raises(LockError):
        lock.renew()
    assert not lock.acquired
    assert redis_client.exists(KEY) == 0  # renew never recreates the key


def test_expired_owner_cannot_touch_the_next_owner(redis_client: redis.Redis) -> None:
    old, new = make(redis_client, ttl=0.2), make(redis_client, ttl=30)
    assert old.acquire()
    time.sleep(0.4)
    assert new.acquire() is True
    with pytest.raises(LockError):
        old.renew(ttl=60)
    assert old.release() is False
    assert redis_client.get(KEY) == new.token.encode()
    assert redis_client.pttl(KEY) <= 30_000
    assert new.release() is True


def test_context_manager(redis_client: redis.Redis) -> None:
    with make(redis_client) as lock:
        assert lock.acquired
        assert redis_client.get(KEY) == lock.token.encode()
    assert redis_client.exists(KEY) == 0
    assert not lock.acquired


def test_context_manager_releases_on_exception(redis_client: redis.Redis) -> None:
    with pytest.raises(RuntimeError), make(redis_client):
        assert redis_client.exists(KEY) == 1
        raise RuntimeError("boom")
    assert redis_client.exists(KEY) == 0


def test_context_manager_when_held_elsewhere_leaves_it_alone(redis_client: redis.Redis) -> None:
    holder = make(redis_client)
    assert holder.acquire()
    with make(redis_client) as lock:
        assert not lock.acquired
    assert redis_client.get(KEY) == holder.token.encode()
    assert holder.release()


def test_wait_polls_until_holder_releases(redis_client: redis.Redis) -> None:
    holder = make(redis_client)
    assert holder.acquire()
    released = threading.Event()

    def release_later() -> None:
        time.sleep(0.3)
        released.set()
        holder.release()

    thread = threading.Thread(target=release_later)
    thread.start()
    try:
        waiter = make(redis_client)
        assert waiter.acquire(wait=20) is True
        assert released.is_set()  # it could only get the lock after the release
        assert redis_client.get(KEY) == waiter.token.encode()
    finally:
        thread.join()
    waiter.release()


def test_wait_from_constructor_and_context_manager(redis_client: redis.Redis) -> None:
    holder = make(redis_client)
    assert holder.acquire()
    thread = threading.Timer(0.2, holder.release)
    thread.start()
    try:
        with make(redis_client, wait=20) as lock:
            assert lock.acquired
            assert not holder.owned()
    finally:
        thread.join()
    assert redis_client.exists(KEY) == 0


def test_wait_gives_up_while_held(redis_client: redis.Redis) -> None:
    holder = make(redis_client)
    assert holder.acquire()
    waiter = make(redis_client)
    assert waiter.acquire(wait=0.2) is False
    assert not waiter.acquired
    assert redis_client.get(KEY) == holder.token.encode()
    holder.release()


def test_locks_with_different_names_are_independent(redis_client: redis.Redis) -> None:
    a = CrawlLock(redis_client, KEYS, "flush")
    b = CrawlLock(redis_client, KEYS, "migrate")
    c = CrawlLock(redis_client, CrawlKeys("other"), "flush")
    assert a.acquire() and b.acquire() and c.acquire()
    assert a.release() and b.release() and c.release()


def test_redis_py_lock_errors_become_redcrawl_lock_errors(redis_client: redis.Redis) -> None:
    never_taken = make(redis_client)
    with pytest.raises(LockError) as info:
        never_taken.renew()
    assert not isinstance(info.value, redis.exceptions.RedisError)
    assert "renew it more often" in str(info.value)
    assert never_taken.release() is False


def test_interoperates_with_redis_py_locks(redis_client: redis.Redis) -> None:
    """The key holds a plain token, as redis-py's own Lock writes it: a tool using
    ``redis.lock.Lock`` on the same key and a CrawlLock exclude each other."""
    other = redis.lock.Lock(redis_client, KEY, timeout=30)
    assert other.acquire(blocking=False)
    lock = make(redis_client)
    assert lock.acquire() is False
    other.release()
    assert lock.acquire() is True
    assert not redis.lock.Lock(redis_client, KEY, timeout=30).acquire(blocking=False)
    lock.release()
