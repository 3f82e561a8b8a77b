"""The frontier contract on a real Redis Cluster (3 masters, 3 replicas: tests/cluster.py).

The core frontier tests of tests/test_frontier.py, the settle pipeline and lost-reply
tests, the dedupe filters, the lock and the robots.txt cache run here again, unchanged,
with ``redis_client`` replaced by a ``redis+cluster://`` client (a
:class:`redcrawl.cluster.ClusterClient`), on both backends. The lost-reply tests drop
a reply on the way from a master (a proxy in front of each master,
:class:`ClusterDropper`): the retried call must replay, not repeat. A crawl lives in one
hash slot (``{crawl}``), so on the cluster it lives on one master; several crawls spread
over the masters.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from redcrawl.connection import connect
from redcrawl.redis_server import LocalCluster
from redcrawl.settings import Settings

from . import cluster
from .proxykit import ReplyDropper
from .test_dedupe import (  # noqa: F401 - collected here again, on the cluster
    test_done_filters_and_recrawl_bypasses_it,
    test_exact_stores_63_bit_integers_in_intset_buckets,
    test_own_bloom_scales_with_layers_and_bounded_keys,
    test_recrawl_window_expires_done_fingerprints,
)
from .test_frontier import (  # noqa: F401
    test_crawls_are_isolated_and_keys_share_a_hash_tag,
    test_describe_follows_a_request_through_its_states,
    test_done_fingerprint_still_filters_but_queued_and_done_are_apart,
    test_dont_filter_bypasses_dedupe,
    test_heartbeat_keeps_leases_alive,
    test_inspection,
    test_lease_ack_cycle_and_counts,
    test_lease_expires_and_is_reclaimed_once,
    test_malformed_envelopes_go_dead_not_loop,
    test_many_reclaimers_do_not_double_requeue,
    test_nack_retries_with_delay_then_dead,
    test_no_retry_goes_dead_and_requeue_dead,
    test_pause_resume,
    test_purge_removes_everything,
    test_push_dedupes_within_and_across_batches,
    test_push_with_delay_waits_in_delayed,
    test_release_gives_back_without_spending_an_attempt,
    test_release_worker_forces_reclaim,
    test_server_clock_is_used_without_test_clock,
    test_settle_in_batches_acks_after_every_push,
    test_settle_stores_children_before_acking_parent,
    test_stale_lease_cannot_ack_after_dead_and_requeue,
    test_strict_priority_order_fifo_among_equals,
    test_tiers_weighted_fair_choice,
)
from .test_lock import (  # noqa: F401
    test_acquire_and_release,
    test_expired_owner_cannot_touch_the_next_owner,
    test_interoperates_with_redis_py_locks,
    test_renew_by_non_owner_is_lock_error_and_does_not_extend,
    test_wait_polls_until_holder_releases,
)
from .test_lost_reply import (  # noqa: F401
    test_every_state_changing_call_is_replayed_not_repeated,
    test_lost_lease_reply_returns_the_same_lease,
    test_lost_settle_reply_pushes_acks_and_leases_once,
)
from .test_robots import (  # noqa: F401 - the shared robots.txt cache (pipelined scripts)
    keys,
    test_a_lock_is_renewed_only_by_its_owner,
    test_crawl_delay_is_merged_into_the_override_keeping_operator_fields,
    test_entries_expire_and_are_fetched_again,
    test_one_worker_fetches_the_others_wait_then_all_read_it,
    test_the_cache_stays_under_its_bound,
)
from .test_settle_begin import (  # noqa: F401
    test_a_refused_call_raises_and_the_next_one_works,
    test_a_script_cache_flush_between_calls_is_survived,
    test_lost_replies_on_the_pipe_are_replayed_not_repeated,
    test_pipelined_settles_do_what_settle_does_in_order,
)

pytestmark = pytest.mark.cluster


@pytest.fixture
def redis_client(redis_cluster: LocalCluster) -> Iterator[redis.Redis]:
    """The cluster, flushed, instead of a single server (the imported tests use it)."""
    client = cluster.client(redis_cluster)
    yield client
    client.close()


@pytest.fixture
def redis7_client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


class ClusterDropper:
    """tests/proxykit.py's reply-dropping proxy in front of every master of the cluster:
    a client from :meth:`client` reaches the masters through them (redis-py's
    ``address_remap``), so a reply lost on the way is lost on a cluster connection."""

    def __init__(self, local: LocalCluster) -> None:
        self.local = local
        self.proxies = {m.port: ReplyDropper(m.port) for m in local.masters()}
        self._clients: list[redis.Redis] = []

    @property
    def dropped(self) -> int:
        return sum(p.dropped for p in self.proxies.values())

    def arm(self) -> None:
        """The next script call's reply is dropped (on whichever master it goes to)."""
        for p in self.proxies.values():
            p.arm()

    def client(self, settings: Settings) -> redis.Redis:
        def remap(address: tuple[str, int]) -> tuple[str, int]:
            proxy = self.proxies.get(address[1])
            return ("127.0.0.1", proxy.port) if proxy else address

        client = connect(settings, url=self.local.url, address_remap=remap)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for c in self._clients:
            c.close()
        for p in self.proxies.values():
            p.close()


@pytest.fixture
def dropper(redis_cluster: LocalCluster) -> Iterator[ClusterDropper]:
    proxy = ClusterDropper(redis_cluster)
    yield proxy
    proxy.close()
