"""A prefill/decode pair of the real vLLM CPU build, joined by NIXL, against hand arithmetic.

The pages are tests/fixtures/metrics/cpu-0.32-disagg/ (tests/capture_disagg.py): four
requests of 300 prompt tokens through the pair, then three sent to the consumer alone.
Every expected value is worked out from the raw counters of those pages, by hand, in the
test; the tiny model's KV is 2,048 bytes a token (4 layers × 2 KV heads × 64 dims × K
and V × 2 bytes) and the CPU backend's blocks are 128 tokens.
"""

from __future__ import annotations

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core import disagg_page as kv
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import Increase, increase_between
from vllm_glassbox.core.snapshot import read_snapshot

from tests.fixtures import built_mooncake_page, built_mooncake_store_page, log, page

DIR = "cpu-0.32-disagg/"
WINDOW = 60.0


def between(before: str, after: str, seconds: float = WINDOW) -> Increase:
    a, b = read_snapshot(page(DIR + before)), read_snapshot(page(DIR + after))
    key = next(iter(b.engines))
    return increase_between(a.engines[key].counters, b.engines[key].counters, seconds)


@pytest.fixture(scope="module")
def paired() -> Increase:
    """The consumer over the four requests whose KV the producer sent."""
    return between("nixl-consumer-idle.txt", "nixl-consumer-after-pair.txt")


@pytest.fixture(scope="module")
def misrouted() -> Increase:
    """The consumer over the three requests sent to it alone."""
    return between("nixl-consumer-after-pair.txt", "nixl-consumer-after-misrouted.txt")


def test_the_consumer_received_every_prompt_token_of_the_pair_by_transfer(paired: Increase) -> None:
    # 4 requests × 300 prompt tokens, all 1,200 external_kv_transfer, none computed here.
    assert derive.prompt_tokens_by_source(paired) == 1_200
    assert derive.prompt_token_source_shares(paired) == {
        "local_compute": 0.0,
        "local_cache_hit": 0.0,
        "external_kv_transfer": 1.0,
    }
    assert derive.locally_prefilled_tokens_per_second(paired) == 0.0


def test_the_transfers_moved_whole_blocks_at_bytes_over_seconds(paired: Increase) -> None:
    # Each request's 300 tokens fill 3 blocks of 128: 3 × 128 × 2,048 = 786,432 bytes, 4 of
    # them 3,145,728, in 0.164887 s of transfers (the page's nixl_xfer_time_seconds_sum).
    assert paired[kv.KV_TRANSFER_BYTES] == 4 * 3 * 128 * 2048
    assert derive.kv_transfer_bandwidth(paired) == pytest.approx(3_145_728 / 0.164887)
    assert derive.kv_transfer_seconds(paired) == pytest.approx(0.164887 / 4)
    assert derive.kv_transfer_bytes_per_second(paired) == pytest.approx(3_145_728 / WINDOW)
    assert derive.kv_transfer_bytes_per_token(paired) == pytest.approx(3_145_728 / 1_200)
    assert derive.kv_transfer_failures_per_second(paired) == 0.0
    assert derive.kv_transfer_expirations_per_second(paired) == 0.0


def test_a_transfer_lasts_a_decode_step_and_a_third(paired: Increase) -> None:
    # 124 decode steps (4 × 31) took 3.856073273 s: 31.1 ms a step; a transfer 41.2 ms.
    step = 3.856073273000675 / 124
    assert derive.kv_transfer_decode_steps(paired) == pytest.approx((0.164887 / 4) / step)
    assert derive.kv_transfer_decode_steps(paired) == pytest.approx(1.33, abs=0.005)


def test_the_link_utilization_is_the_bandwidth_over_the_peak_and_never_above_one(
    paired: Increase,
) -> None:
    achieved = 3_145_728 / 0.164887  # 19.1 MB/s over UCX's TCP on loopback
    assert derive.kv_transfer_link_utilization(paired, 1.25e9) == pytest.approx(achieved / 1.25e9)
    assert derive.kv_transfer_link_utilization(paired, 10e6) is None  # a peak below the measured
    assert derive.kv_transfer_link_utilization(paired, None) is None


def test_the_misrouted_requests_were_prefilled_by_the_consumer_itself(misrouted: Increase) -> None:
    # 3 × 300 tokens, every one local_compute; no transfer in the window.
    assert derive.prompt_token_source_shares(misrouted)["local_compute"] == 1.0
    assert derive.locally_prefilled_tokens_per_second(misrouted) == pytest.approx(900 / WINDOW)
    assert derive.kv_transfer_bandwidth(misrouted) is None  # no transfer: absent, not 0
    assert derive.kv_transfer_bytes_per_second(misrouted) == 0.0
    # Its prefill seconds: 0.651277314 − 0.311729855 over the three, all on local tokens.
    prefill = 0.6512773139984347 - 0.3117298549991574
    assert derive.prefill_seconds_on_local_tokens(misrouted) == pytest.approx(prefill / WINDOW)


def test_the_bandwidth_misrouted_traffic_needs_is_its_tokens_at_the_pairs_bytes_per_token(
    paired: Increase, misrouted: Increase
) -> None:
    needed = derive.kv_transfer_bandwidth_needed(
        derive.locally_prefilled_tokens_per_second(misrouted),
        derive.kv_transfer_bytes_per_token(paired),
    )
    assert needed == pytest.approx(900 / WINDOW * 3_145_728 / 1_200)


def test_the_producer_computed_every_prompt_and_transferred_nothing_itself() -> None:
    d = between("nixl-producer-idle.txt", "nixl-producer-after-pair.txt")
    assert derive.prompt_token_source_shares(d)["local_compute"] == 1.0
    assert d[s.PROMPT_TOKENS] == 1_200
    assert derive.kv_transfer_bandwidth(d) is None  # the consumer reads: NIXL times it there


def test_series_without_their_families_are_absent_not_zero() -> None:
    plain = Increase({s.PROMPT_TOKENS: 300.0, s.ITL_SUM: 1.0, s.ITL_COUNT: 10.0}, WINDOW)
    assert derive.prompt_token_source_shares(plain) == {}
    assert derive.locally_prefilled_tokens_per_second(plain) is None
    assert derive.kv_transfer_bytes_per_second(plain) is None
    assert derive.kv_transfer_failures_per_second(plain) is None
    assert derive.kv_transfer_expirations_per_second(plain) is None
    assert derive.kv_transfer_decode_steps(plain) is None
    assert derive.prefill_seconds_on_local_tokens(plain) is None


# --- the page ---------------------------------------------------------------------------


def test_the_consumers_page_shows_nixl_and_its_fetch_stages() -> None:
    snap = read_snapshot(page(DIR + "nixl-consumer-after-pair.txt"))
    (engine,) = snap.engines.values()
    assert snap.kv_connectors == ("nixl",)
    assert {n for n in engine.gauges if n.startswith(kv.KV_FETCH)} == {
        kv.KV_FETCH + stage for stage in kv.FETCH_STAGES
    }
    assert engine.gauges[kv.WAITING_FOR + "deferred"] == 0.0
    assert snap.unrecognised == {}
    assert snap.adapters is None  # no --enable-lora


def test_each_role_is_read_from_the_log_and_the_page_agrees() -> None:
    for side, role in (("producer", "producer"), ("consumer", "consumer")):
        text = log(f"cpu-0.32-nixl-{side}-startup.log")
        logged = [r for line in text.splitlines() if (r := kv.role_in_log(line)) is not None]
        assert logged == [kv.KvRole(role, "NixlConnector", "log")]
        snap = read_snapshot(page(DIR + f"nixl-{side}-after-pair.txt"))
        consumer = any(n.startswith(kv.KV_FETCH) for e in snap.engines.values() for n in e.gauges)
        on_page = kv.role_on_page(consumer, list(snap.kv_connectors), fetch_stages_exist=True)
        assert on_page == kv.KvRole(role, "nixl", "page")


def test_a_connector_without_the_fetch_stages_of_its_release_is_of_unknown_side() -> None:
    assert kv.role_on_page(False, ["nixl"], fetch_stages_exist=False).role == "unknown"
    assert kv.role_on_page(False, [], fetch_stages_exist=True).role == "none"
    assert kv.server_role(kv.KvRole("both", "NixlConnector", "log"), True, ["nixl"], True).role == (
        "both"
    )


def test_a_failed_handshake_is_counted_and_expired_kv_on_the_producer_too() -> None:
    # The consumer was sent a producer's port no one listens on: NIXL's handshake failed.
    failed = between("nixl-consumer-after-misrouted.txt", "nixl-consumer-after-failure.txt")
    assert failed[kv.KV_TRANSFER_FAILURES] == 1
    assert derive.kv_transfer_failures_per_second(failed) == pytest.approx(1 / WINDOW)
    assert derive.kv_transfer_bandwidth(failed) is None  # nothing moved
    # Two requests prefilled for a consumer that never fetched them: their lease ran out.
    expired = between("nixl-producer-after-misrouted.txt", "nixl-producer-after-expiry.txt")
    assert expired[kv.KV_TRANSFER_EXPIRED] == 2
    assert derive.kv_transfer_expirations_per_second(expired) == pytest.approx(2 / WINDOW)


# --- pages built from vLLM's source (no build here runs them) ---------------------------


def test_mooncakes_families_give_the_same_transfers_as_nixls() -> None:
    before = read_snapshot(built_mooncake_page(page(DIR + "nixl-consumer-idle.txt")))
    after = read_snapshot(built_mooncake_page(page(DIR + "nixl-consumer-after-pair.txt")))
    assert after.kv_connectors == ("mooncake",)
    key = next(iter(after.engines))
    d = increase_between(before.engines[key].counters, after.engines[key].counters, WINDOW)
    assert derive.kv_transfer_bandwidth(d) == pytest.approx(3_145_728 / 0.164887)
    assert d[kv.KV_TRANSFER_FAILURES] == 0  # failed transfers and receives, summed


def test_a_consumer_whose_transfers_glassbox_does_not_read_is_flagged_not_guessed() -> None:
    store = read_snapshot(built_mooncake_store_page(page(DIR + "nixl-consumer-after-pair.txt")))
    assert store.kv_connectors == ()
    assert set(store.unrecognised) == {"kv_transfer_families_not_read"}
    assert (
        "vllm:mooncake_store_operation_bytes_total"
        in store.unrecognised["kv_transfer_families_not_read"]
    )
    (engine,) = store.engines.values()
    assert kv.KV_TRANSFER_BYTES not in engine.counters  # not read from the store's bytes


def test_a_consumer_page_without_any_transfer_family_says_so() -> None:
    # ExampleConnector (captured) exports none: its consumer's fetch stages alone.
    snap = read_snapshot(page(DIR + "example-consumer-after-pair.txt"))
    assert snap.kv_connectors == ()
    assert set(snap.unrecognised) == {"kv_consumer_without_transfer_families"}
    # A producer of it (no fetch stages) shows nothing to flag: no role on the page.
    assert read_snapshot(page(DIR + "example-producer-after-pair.txt")).unrecognised == {}


def test_no_prefill_saving_is_computed_over_a_window_with_a_failed_load() -> None:
    # The failed request's prefill time grew the sum by 3,048.5 s: not a prefill time.
    d = between("nixl-consumer-after-pair.txt", "nixl-consumer-after-failure.txt")
    assert d[s.PREFILL_SUM] > 3000
    assert derive.prompt_token_source_shares(d)["local_compute"] == 1.0  # the 3 misrouted
    assert derive.prefill_seconds_on_local_tokens(d) is None


def test_the_failure_ratio_counts_failures_among_all_transfers_tried() -> None:
    # After the pair: 4 transfers, 0 failed; then 1 failed handshake and no transfer.
    assert (
        derive.kv_transfer_failure_ratio(
            between("nixl-consumer-idle.txt", "nixl-consumer-after-pair.txt")
        )
        == 0.0
    )
    d = between("nixl-consumer-idle.txt", "nixl-consumer-after-failure.txt")
    assert derive.kv_transfer_failure_ratio(d) == pytest.approx(1 / (1 + 4))
    assert derive.kv_transfer_failure_ratio(Increase({}, WINDOW)) is None  # no connector


def test_adapters_beyond_the_budget_wait() -> None:
    assert derive.adapters_over_budget(2.0, 1.0) == 1.0
    assert derive.adapters_over_budget(1.0, 4.0) == 0.0
    assert derive.adapters_over_budget(None, 1.0) is None
    # The captured deferred page: 3 of 3 waiting requests deferred, none for capacity.
    assert derive.deferred_share_of_waiting(3.0, 3.0) == 1.0
    assert derive.deferred_share_of_waiting(0.0, 0.0) is None  # none waits


def test_the_queue_time_the_deferred_waits_account_for() -> None:
    # Six requests of two adapters at once, --max-loras 1: 84.79 s of queue in all, 14.13 s
    # each on average; at the deferred page every waiting request was deferred.
    d = between("lora-idle.txt", "lora-after.txt")
    assert derive.mean_queue_seconds(d) == pytest.approx(84.78842819699958 / 6)
    share = derive.deferred_share_of_waiting(3.0, 3.0)
    assert derive.queue_seconds_deferred(d, share) == pytest.approx(84.78842819699958 / 6)
    assert derive.queue_seconds_deferred(d, None) is None


def test_the_transfer_families_are_read_under_a_launchers_prefix() -> None:
    # Ray Serve's names (ray_vllm_ for vllm:): the same families, the same transfers.
    text = page(DIR + "nixl-consumer-after-pair.txt").replace("vllm:", "ray_vllm_")
    snap = read_snapshot(text, prefix="auto")
    assert snap.prefix == "ray_vllm_" and snap.kv_connectors == ("nixl",)
    (engine,) = snap.engines.values()
    assert engine.counters[kv.KV_TRANSFER_BYTES] == 3_145_728
    assert engine.counters[kv.PROMPT_FROM + "external_kv_transfer"] == 1_200
