"""Every derived formula (SPEC §2) against hand arithmetic on before/after pages.

The captured pairs come from the real vLLM CPU build with known requests between them
(tests/fixtures/README.md); the v0.11.0 pairs are synthesized with the article's numbers.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import (
    Context,
    Increase,
    counter_increase,
    increase_between,
)
from vllm_glassbox.core.series import WINDOWED
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec

from tests.fixtures import page

TINY = EngineKey("tiny", "0")
AWQ = "Qwen/Qwen2.5-7B-Instruct-AWQ"
#: Bytes of the captured model's weights (BF16), as its safetensors file holds them.
TINY_WEIGHTS = TinyModelSpec("tiny-capture").parameter_count() * 2
PEAK = 20e9  # an assumed peak memory bandwidth, bytes/s


def between(before: str, after: str, seconds: float = 10.0, engine: str = "0") -> Increase:
    """Increase of one engine's counters from one fixture page to another."""
    a, b = read_snapshot(page(before)), read_snapshot(page(after))
    key = next(k for k in b.engines if k.engine == engine)
    old = a.engines[key].counters if key in a.engines else {}
    return increase_between(old, b.engines[key].counters, seconds)


# --- decode (captured, no speculation) ----------------------------------------------------


@pytest.fixture(scope="module")
def plain() -> Increase:
    """Three sequential requests of 64 tokens (ignore_eos) on the plain server."""
    return between("cpu-0.32/plain-idle.txt", "cpu-0.32/plain-after-3x64.txt")


def test_without_speculation_each_decode_step_makes_exactly_one_token(plain: Increase) -> None:
    assert plain[s.GENERATION_TOKENS] == 3 * 64
    assert plain[s.TTFT_COUNT] == 3
    assert derive.decode_tokens(plain) == 3 * 63
    assert plain[s.ITL_COUNT] == 3 * 63
    assert derive.tokens_per_forward_pass(plain) == 1.0


def test_without_speculation_tpot_equals_itl(plain: Increase) -> None:
    itl_sum = plain[s.ITL_SUM]
    assert derive.time_per_output_token(plain) == pytest.approx(itl_sum / 189)
    assert derive.inter_token_latency(plain) == pytest.approx(itl_sum / 189)
    assert 0 < itl_sum / 189 < 1.0  # a tiny model on CPU: milliseconds per step


def test_one_request_at_a_time_makes_one_token_per_engine_step(plain: Increase) -> None:
    assert plain[s.ENGINE_STEPS] == 192  # 1 prefill + 63 decode steps per request
    assert derive.tokens_per_engine_step(plain) == 1.0
    assert derive.engine_steps_per_second(plain) == 192 / 10.0


def test_time_to_first_token_is_the_mean_over_requests(plain: Increase) -> None:
    assert derive.time_to_first_token(plain) == pytest.approx(plain[s.TTFT_SUM] / 3)


def test_without_speculation_every_spec_value_is_absent(plain: Increase) -> None:
    assert derive.spec_acceptance_ratio(plain) is None
    assert derive.spec_mean_acceptance_length(plain) is None
    assert derive.spec_position_acceptance(plain) == {}
    assert derive.spec_draft_coverage(plain) is None  # no spec counters: absent, not 0


def test_a_window_of_two_requests(plain: Increase) -> None:
    d = between("cpu-0.32/plain-after-1x64.txt", "cpu-0.32/plain-after-3x64.txt")
    assert (d[s.GENERATION_TOKENS], d[s.TTFT_COUNT], d[s.ITL_COUNT]) == (128, 2, 126)
    assert derive.tokens_per_forward_pass(d) == 1.0


# --- speculative decoding (captured, ngram k=5) ------------------------------------------


@pytest.fixture(scope="module")
def spec() -> Increase:
    """One 256-token request on the repetitive prompt, repetition_penalty 1.0."""
    return between("cpu-0.32/spec-idle.txt", "cpu-0.32/spec-after-1x256.txt")


def test_speculation_makes_more_than_one_token_per_forward_pass(spec: Increase) -> None:
    assert derive.decode_tokens(spec) == 255
    steps = spec[s.ITL_COUNT]
    assert steps < 255 / 2  # most steps verified several tokens
    assert derive.tokens_per_forward_pass(spec) == 255 / steps
    assert 1.0 < 255 / steps <= 6.0  # at most k + 1 tokens per step


def test_under_speculation_tpot_is_per_token_and_itl_is_per_step(spec: Increase) -> None:
    tpot, itl = derive.time_per_output_token(spec), derive.inter_token_latency(spec)
    per_pass = derive.tokens_per_forward_pass(spec)
    assert tpot == pytest.approx(spec[s.ITL_SUM] / 255)
    assert itl == pytest.approx(spec[s.ITL_SUM] / spec[s.ITL_COUNT])
    assert tpot is not None and per_pass is not None
    assert tpot * per_pass == pytest.approx(itl)


def test_decode_tokens_are_steps_plus_accepted_drafts_up_to_the_max_tokens_cut(
    spec: Increase,
) -> None:
    # Each step emits accepted + 1 tokens; the last step may be cut at max_tokens (≤ k).
    surplus = spec[s.ITL_COUNT] + spec[s.SPEC_ACCEPTED] - derive.decode_tokens(spec)
    assert 0 <= surplus <= 5


def test_acceptance_ratio_length_and_coverage(spec: Increase) -> None:
    drafts, draft_tokens, accepted = (
        spec[s.SPEC_DRAFTS],
        spec[s.SPEC_DRAFT_TOKENS],
        spec[s.SPEC_ACCEPTED],
    )
    assert 0 < accepted <= draft_tokens <= 5 * drafts
    assert derive.spec_acceptance_ratio(spec) == accepted / draft_tokens
    assert derive.spec_mean_acceptance_length(spec) == 1 + accepted / drafts
    assert derive.spec_draft_coverage(spec) == drafts / spec[s.ITL_COUNT]


def test_acceptance_by_position_falls_with_the_position(spec: Increase) -> None:
    by_position = derive.spec_position_acceptance(spec)
    assert list(by_position) == ["0", "1", "2", "3", "4"]
    drafts = spec[s.SPEC_DRAFTS]
    for position, ratio in by_position.items():
        assert ratio == spec[s.SPEC_ACCEPTED_AT + position] / drafts
    values = list(by_position.values())
    assert values == sorted(values, reverse=True)
    # A token accepted at position p was accepted at every earlier position.
    assert sum(spec[s.SPEC_ACCEPTED_AT + p] for p in by_position) == spec[s.SPEC_ACCEPTED]


def test_the_first_speculative_request_pays_a_one_off_prefill(spec: Increase) -> None:
    second = between("cpu-0.32/spec-after-1x256.txt", "cpu-0.32/spec-after-2x256.txt")
    first_ttft, second_ttft = derive.time_to_first_token(spec), derive.time_to_first_token(second)
    assert first_ttft is not None and second_ttft is not None
    assert first_ttft > 5 * second_ttft  # the ngram proposer compiles on first use


# --- weights and bandwidth ----------------------------------------------------------------


def test_weight_bytes_per_output_token_is_amortized_by_speculation(
    plain: Increase, spec: Increase
) -> None:
    assert derive.weight_bytes_per_output_token(plain, TINY_WEIGHTS) == TINY_WEIGHTS
    expected = TINY_WEIGHTS * spec[s.ENGINE_STEPS] / 256
    assert derive.weight_bytes_per_output_token(spec, TINY_WEIGHTS) == pytest.approx(expected)
    assert expected < TINY_WEIGHTS / 4


def test_bandwidth_utilization_and_decode_floor(spec: Increase) -> None:
    step = spec[s.ITL_SUM] / spec[s.ITL_COUNT]
    achieved = derive.weight_read_bandwidth_per_gpu(spec, TINY_WEIGHTS)
    assert achieved == pytest.approx(TINY_WEIGHTS / step)
    assert derive.memory_bandwidth_utilization(spec, TINY_WEIGHTS, PEAK) == pytest.approx(
        TINY_WEIGHTS / step / PEAK
    )
    assert derive.decode_floor_seconds(TINY_WEIGHTS, PEAK) == TINY_WEIGHTS / PEAK


def test_weight_values_are_absent_without_weights_or_peak(spec: Increase) -> None:
    assert derive.weight_bytes_per_output_token(spec, None) is None
    assert derive.weight_read_bandwidth_per_gpu(spec, None) is None
    assert derive.memory_bandwidth_utilization(spec, TINY_WEIGHTS, None) is None
    assert derive.memory_bandwidth_utilization(spec, None, PEAK) is None
    assert derive.decode_floor_seconds(TINY_WEIGHTS, None) is None
    assert derive.decode_floor_seconds(None, PEAK) is None


# --- the flood: batching, preemption, KV ---------------------------------------------------


def test_flood_preempts_and_batches() -> None:
    d = between("cpu-0.32/spec-after-2x256.txt", "cpu-0.32/flood-after.txt", seconds=60.0)
    assert d[s.TTFT_COUNT] == 12  # one first token per request, preempted or not
    assert d[s.PREEMPTIONS] > 0
    assert derive.preemptions_per_second(d) == d[s.PREEMPTIONS] / 60.0
    # Twelve sequences in flight: one engine step makes several tokens.
    assert derive.tokens_per_engine_step(d) == d[s.GENERATION_TOKENS] / d[s.ENGINE_STEPS]
    assert d[s.GENERATION_TOKENS] / d[s.ENGINE_STEPS] > 2
    per_token = derive.weight_bytes_per_output_token(d, TINY_WEIGHTS)
    assert per_token is not None and per_token < TINY_WEIGHTS / 2


def test_sampled_flood_drafts_are_counted_even_when_none_is_accepted() -> None:
    d = between("cpu-0.32/spec-after-2x256.txt", "cpu-0.32/flood-mid.txt")
    assert d[s.SPEC_DRAFT_TOKENS] > 0
    # The denominator grew: a ratio (possibly 0), never absent.
    assert derive.spec_acceptance_ratio(d) == d[s.SPEC_ACCEPTED] / d[s.SPEC_DRAFT_TOKENS]


def test_kv_used_tokens_mid_flood_is_usage_times_capacity() -> None:
    snap = read_snapshot(page("cpu-0.32/flood-mid.txt"))
    usage = snap.engines[TINY].gauges[s.KV_USAGE]
    capacity = derive.kv_cache_capacity_tokens(snap.cache["0"])
    assert snap.engines[TINY].gauges[s.WAITING] > 0
    assert usage > 0.9
    assert derive.kv_cache_used_tokens(usage, capacity) == usage * 4096
    assert derive.kv_cache_used_tokens(None, capacity) is None
    assert derive.kv_cache_used_tokens(usage, None) is None


# --- v0.11.0 pages: the article's speculative run and the penalty bypass ------------------


def test_article_speculative_run_has_5_93_tokens_per_forward_pass() -> None:
    d = between("v0.11.0-single/idle.txt", "v0.11.0-single/after-spec.txt")
    assert derive.tokens_per_forward_pass(d) == 255 / 43
    assert derive.spec_acceptance_ratio(d) == 1.0
    assert derive.spec_mean_acceptance_length(d) == 1 + 212 / 43
    assert derive.spec_draft_coverage(d) == 1.0
    # 40 drafts of 5 tokens and 3 of 4, all accepted: position 4 only in the 40.
    assert derive.spec_position_acceptance(d) == {
        "0": 1.0,
        "1": 1.0,
        "2": 1.0,
        "3": 1.0,
        "4": 40 / 43,
    }
    assert derive.inter_token_latency(d) == pytest.approx(0.0184)
    assert derive.time_per_output_token(d) == pytest.approx(0.0184 * 43 / 255)
    assert derive.tokens_per_engine_step(d) == 256 / 44  # 1 prefill + 43 decode steps


def test_penalty_bypass_shows_as_zero_coverage_and_absent_acceptance() -> None:
    d = between("v0.11.0-single/after-spec.txt", "v0.11.0-single/after-penalty.txt")
    assert d[s.SPEC_DRAFTS] == 0 and d[s.ITL_COUNT] == 255
    assert derive.spec_draft_coverage(d) == 0.0  # decode steps happened, none drafted
    assert derive.spec_acceptance_ratio(d) is None
    assert derive.spec_mean_acceptance_length(d) is None
    assert derive.spec_position_acceptance(d) == {}
    assert derive.tokens_per_forward_pass(d) == 1.0


# --- absence -----------------------------------------------------------------------------


def test_nothing_happened_every_ratio_is_absent_and_rates_are_zero() -> None:
    d = between("cpu-0.32/spec-after-2x256.txt", "cpu-0.32/spec-after-2x256.txt")
    context = Context(weights_bytes=TINY_WEIGHTS, peak_bandwidth=PEAK)
    values = {series.name: series.compute(d, context) for series in WINDOWED}
    rates = {"glassbox_engine_steps_per_second", "glassbox_preemptions_per_second"}
    assert {name: v for name, v in values.items() if name in rates} == dict.fromkeys(rates, 0.0)
    assert {name: v for name, v in values.items() if name not in rates} == dict.fromkeys(
        set(values) - rates
    )
    assert derive.spec_position_acceptance(d) == {}


def test_rates_over_no_time_are_absent() -> None:
    d = Increase({s.ENGINE_STEPS: 5, s.PREEMPTIONS: 1}, seconds=0.0)
    assert derive.engine_steps_per_second(d) is None
    assert derive.preemptions_per_second(d) is None


def test_preemption_rate_is_absent_when_vllm_has_no_such_counter() -> None:
    assert derive.preemptions_per_second(Increase({s.GENERATION_TOKENS: 5}, 10.0)) is None


# --- aggregation across engines ------------------------------------------------------------


def test_engines_aggregate_by_summing_increases_not_averaging_ratios() -> None:
    e0 = between("v0.11.0-dp2/before.txt", "v0.11.0-dp2/after.txt", engine="0")
    e1 = between("v0.11.0-dp2/before.txt", "v0.11.0-dp2/after.txt", engine="1")
    # Engine 0: one speculative request (255 decode tokens in 43 steps);
    # engine 1: three requests that bypassed speculation (3 × 255 tokens, one per step).
    assert derive.tokens_per_forward_pass(e0) == 255 / 43
    assert derive.tokens_per_forward_pass(e1) == 1.0
    both = e0.alongside(e1)
    assert derive.tokens_per_forward_pass(both) == (255 + 765) / (43 + 765)
    mean_of_ratios = (255 / 43 + 1.0) / 2
    assert derive.tokens_per_forward_pass(both) == pytest.approx(1.2624, abs=1e-4)
    assert mean_of_ratios == pytest.approx(3.4651, abs=1e-4)
    assert derive.spec_draft_coverage(both) == 43 / (43 + 765)
    assert derive.spec_acceptance_ratio(both) == 1.0


def test_engines_side_by_side_sum_counters_and_keep_the_longest_span() -> None:
    a = Increase({"x": 1.0, "y": 2.0}, 10.0)
    b = Increase({"y": 3.0, "z": 4.0}, 12.0)
    total = a.alongside(b)
    assert dict(total.counters) == {"x": 1.0, "y": 5.0, "z": 4.0}
    assert total.seconds == 12.0
    assert derive.engines_together([a, b], 12.0) == total


def test_runs_one_after_another_sum_counters_and_spans() -> None:
    first = Increase({s.ENGINE_STEPS: 30.0}, 10.0)
    second = Increase({s.ENGINE_STEPS: 90.0}, 20.0)
    both = first.then(second)
    assert dict(both.counters) == {s.ENGINE_STEPS: 120.0}
    assert both.seconds == 30.0
    # 120 steps in 30 s; taking the longer span (as for parallel engines) said 6 a second.
    assert derive.engine_steps_per_second(both) == 4.0
    assert derive.engine_steps_per_second(first.alongside(second)) == 6.0


def test_increase_has_no_ambiguous_plus() -> None:
    a = Increase({"x": 1.0}, 1.0)
    with pytest.raises(TypeError):
        _ = a + a  # type: ignore[operator]


# --- counter increases ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "increase"),
    [(10.0, 15.0, 5.0), (15.0, 15.0, 0.0), (15.0, 3.0, 3.0), (15.0, 0.0, 0.0)],
)
def test_a_decrease_is_a_reset_never_a_negative_increase(
    before: float, after: float, increase: float
) -> None:
    assert counter_increase(before, after) == increase


def test_increase_across_a_restart_is_what_the_new_process_counted() -> None:
    # The spec server, then the plain server (a different process) answering at the URL.
    old = read_snapshot(page("cpu-0.32/spec-after-2x256.txt")).engines[TINY].counters
    new = read_snapshot(page("cpu-0.32/plain-after-1x64.txt")).engines[TINY].counters
    for restarted in (False, True):
        d = increase_between(old, new, 10.0, restarted=restarted)
        assert (d[s.GENERATION_TOKENS], d[s.TTFT_COUNT], d[s.ITL_COUNT]) == (64, 1, 63)
        assert derive.tokens_per_forward_pass(d) == 1.0
    # Other counters went down, so the engine restarted: even a counter that happens to
    # be higher than before counts everything the new process counted.
    grown = {**new, s.PROMPT_TOKENS: old[s.PROMPT_TOKENS] + 1}
    assert increase_between(old, grown, 10.0)[s.PROMPT_TOKENS] == grown[s.PROMPT_TOKENS]


def test_a_counter_first_seen_after_counts_from_zero() -> None:
    d = increase_between({}, {s.SPEC_DRAFTS: 4.0}, 1.0)
    assert d[s.SPEC_DRAFTS] == 4.0


# --- tensor parallelism: per-GPU bandwidth and floor ----------------------------------------

QWEN_7B_BF16 = 15.23e9  # bytes of Qwen2.5-7B-Instruct in BF16
L40S = 864e9


def _steps(step_seconds: float, steps: int = 100) -> Increase:
    return Increase({s.ITL_SUM: step_seconds * steps, s.ITL_COUNT: float(steps)}, 60.0)


def test_tensor_parallel_bandwidth_is_per_gpu_and_below_its_peak() -> None:
    # 2 × L40S at TP=2, a 12 ms decode step: each GPU reads half the weights per step.
    d = _steps(0.012)
    per_gpu = derive.weight_read_bandwidth_per_gpu(d, QWEN_7B_BF16, tensor_parallel=2)
    assert per_gpu == pytest.approx(QWEN_7B_BF16 / 2 / 0.012)
    utilization = derive.memory_bandwidth_utilization(d, QWEN_7B_BF16, L40S, tensor_parallel=2)
    assert utilization == pytest.approx(0.7345, abs=1e-4)
    # The layout misread as TP=1 makes one GPU read the whole model: 1.47 of its peak,
    # which no GPU does, so it is absent rather than published.
    assert derive.memory_bandwidth_utilization(d, QWEN_7B_BF16, L40S) is None


def test_tensor_parallel_decode_floor_is_below_the_measured_step() -> None:
    floor = derive.decode_floor_seconds(QWEN_7B_BF16, L40S, tensor_parallel=2)
    assert floor == pytest.approx(0.008814, abs=1e-6)
    assert floor < 0.012  # one GPU's floor for the whole model said 17.6 ms, above the step
    assert derive.decode_floor_seconds(QWEN_7B_BF16, L40S) == pytest.approx(0.017627, abs=1e-6)


def test_pipeline_stages_do_not_change_one_gpus_bandwidth() -> None:
    # TP=1, PP=2: each GPU reads half the weights in half the step; the same rate as TP=1.
    d = _steps(0.020)
    assert derive.weight_read_bandwidth_per_gpu(d, 1e10, tensor_parallel=1) == 1e10 / 0.020


def test_the_fits_marginal_bandwidth_is_the_slopes_inverse() -> None:
    assert derive.marginal_weight_read_bandwidth(0.0015) == pytest.approx(1024**3 / 0.0015)
    assert derive.marginal_weight_read_bandwidth(0.0) is None
    assert derive.marginal_weight_read_bandwidth(-0.001) is None


# --- whole-model weights from the log's lines ---------------------------------------------


def test_every_rank_logged_its_shard_the_copy_is_their_sum() -> None:
    assert derive.weights_from_log({"0": [2.0, 2.0]}, shards=2) == 4.0


def test_one_rank_logged_its_shard_the_copy_is_scaled_to_every_shard() -> None:
    assert derive.weights_from_log({"0": [7.16]}, shards=2) == pytest.approx(14.32)
    assert derive.weights_from_log({"0": [32.8571]}, shards=4) == pytest.approx(131.4284)


def test_data_parallel_copies_count_once() -> None:
    assert derive.weights_from_log({"0": [14.9935], "1": [14.9935]}, shards=1) == 14.9935


def test_more_lines_than_shards_are_all_counted() -> None:
    # A layout the log did not state (V0 logs, no flag): what was logged is all there is.
    assert derive.weights_from_log({"0": [1.0, 1.0, 1.0]}, shards=1) == 3.0
    assert derive.weights_from_log({}, shards=2) is None


def test_active_weights_of_a_mixture_of_experts() -> None:
    # 30.5 B parameters, 29.0 B in 128 routed experts, 8 used per token.
    assert derive.active_weights(30.5, 29.0, 8 / 128) == pytest.approx(30.5 - 29.0 * 120 / 128)
    assert derive.active_weights_of(60.0, 30.0, 3.0) == 6.0  # the checkpoint's proportion


# --- the KV pool: one rule for the exporter and the lab ------------------------------------


def test_kv_capacity_prefers_the_page_then_blocks_then_the_log() -> None:
    cache = read_snapshot(page("cpu-0.32/spec-idle.txt")).cache["0"]
    assert derive.kv_cache_capacity_tokens(cache, logged_tokens=9999) == 4096
    older = dataclasses.replace(cache, kv_cache_size_tokens=None)
    assert derive.kv_cache_capacity_tokens(older, logged_tokens=9999) == 32 * 128
    no_blocks = dataclasses.replace(older, num_gpu_blocks_total=None)
    assert derive.kv_cache_capacity_tokens(no_blocks, logged_tokens=9999) == 9999
    assert derive.kv_cache_capacity_tokens(None, logged_tokens=None) is None


# --- restarts: one rule, every counter of the engine from zero ------------------------------


def _no_process(name: str) -> dict[str, float]:
    """An engine's counters as multiprocess mode shows them: no process start time."""
    return dict(read_snapshot(page(name)).engines[TINY].counters)


def test_a_restart_seen_only_as_some_counters_going_down_resets_every_counter() -> None:
    # The spec server, then (restarted, multiprocess mode) the plain one after 3 × 64.
    old = _no_process("cpu-0.32/spec-after-2x256.txt")
    new = _no_process("cpu-0.32/plain-after-3x64.txt")
    assert new[s.GENERATION_TOKENS] < old[s.GENERATION_TOKENS]  # went down: a restart
    assert new[s.ITL_COUNT] > old[s.ITL_COUNT]  # grew past the old value all the same
    d = increase_between(old, new, 10.0)
    assert (d[s.GENERATION_TOKENS], d[s.TTFT_COUNT], d[s.ITL_COUNT]) == (192, 3, 189)
    assert derive.tokens_per_forward_pass(d) == 1.0  # resetting only the lower ones: 2.247
    assert derive.counters_restarted(old, new)


def test_a_sum_going_down_alone_is_not_a_restart_and_its_ratio_is_absent() -> None:
    # A TTFT observed negative (the wall clock stepped back) while one more request came.
    old = {s.TTFT_SUM: 10.0, s.TTFT_COUNT: 5.0, s.GENERATION_TOKENS: 300.0}
    new = {s.TTFT_SUM: 9.5, s.TTFT_COUNT: 6.0, s.GENERATION_TOKENS: 364.0}
    assert not derive.counters_restarted(old, new)
    d = increase_between(old, new, 10.0)
    assert (d[s.TTFT_COUNT], d[s.GENERATION_TOKENS]) == (1.0, 64.0)
    # How much the sum grew is unknown (clipped to 0 it made the mean TTFT 0 s): absent.
    assert math.isnan(d[s.TTFT_SUM]) and derive.time_to_first_token(d) is None


def test_a_new_process_restarts_every_counter_even_those_that_grew() -> None:
    old = {s.GENERATION_TOKENS: 10.0, s.ITL_COUNT: 5.0}
    new = {s.GENERATION_TOKENS: 64.0, s.ITL_COUNT: 63.0}
    assert increase_between(old, new, 1.0)[s.GENERATION_TOKENS] == 54.0
    assert increase_between(old, new, 1.0, restarted=True)[s.GENERATION_TOKENS] == 64.0
    assert derive.process_restarted(1.0, 2.0)
    assert not derive.process_restarted(None, 2.0)
    assert not derive.process_restarted(1.0, None)
    assert not derive.process_restarted(1.0, 1.0)


# --- KV headroom --------------------------------------------------------------------------


def test_mid_flood_the_full_pool_has_no_free_tokens_and_no_headroom() -> None:
    sample = read_snapshot(page("cpu-0.32/flood-mid.txt")).engines[TINY]
    used = derive.kv_cache_used_tokens(sample.gauges[s.KV_USAGE], 4096)
    assert sample.gauges[s.RUNNING] == 11 and used == 4096
    assert derive.kv_cache_free_tokens(used, 4096) == 0
    assert derive.kv_cache_headroom_requests(used, 4096, sample.gauges[s.RUNNING]) == 0


def test_headroom_counts_whole_requests_of_the_current_mean_size() -> None:
    # 12 requests hold 1,536 of 4,096 tokens: 128 each, so 2,560 free tokens fit 20 more.
    assert derive.kv_cache_mean_request_tokens(1536.0, 12) == 128
    assert derive.kv_cache_headroom_requests(1536.0, 4096, 12) == 20
    # 2,000 free tokens at 300 per request: 6 more whole requests, not 6.67.
    assert derive.kv_cache_headroom_requests(2096.0, 4096, 2096 / 300) == 6
    # A pool used beyond its capacity (rounding) has 0 free, never negative.
    assert derive.kv_cache_free_tokens(4100.0, 4096) == 0


def test_headroom_is_absent_without_a_running_request_or_a_pool() -> None:
    assert derive.kv_cache_headroom_requests(0.0, 4096, 0) is None  # idle: no mean size
    assert derive.kv_cache_headroom_requests(0.0, 4096, 3) is None  # nothing held yet
    assert derive.kv_cache_headroom_requests(None, 4096, 3) is None
    assert derive.kv_cache_headroom_requests(1024.0, None, 3) is None
    assert derive.kv_cache_free_tokens(None, 4096) is None
    # A usage so small its tokens underflow (5e-324 of 4,096 tokens): no mean size, no
    # headroom, never an overflow that would fail the poll.
    assert derive.kv_cache_headroom_requests(5e-324 * 4096, 4096, 3) is None


def test_exhaustion_is_free_tokens_over_the_growth_rate_only_while_growing() -> None:
    assert derive.kv_cache_exhaustion_seconds(1000.0, 500.0, 10.0) == 20.0
    assert derive.kv_cache_exhaustion_seconds(0.0, 500.0, 10.0) == 0.0  # full and growing
    assert derive.kv_cache_exhaustion_seconds(1000.0, 0.0, 10.0) is None  # flat
    assert derive.kv_cache_exhaustion_seconds(1000.0, -300.0, 10.0) is None  # draining
    assert derive.kv_cache_exhaustion_seconds(1000.0, 500.0, 0.0) is None  # no span
    assert derive.kv_cache_exhaustion_seconds(None, 500.0, 10.0) is None


def test_headroom_at_completion_prices_running_requests_at_the_size_requests_finish_at() -> None:
    # Between the flood's middle and its end the 12 flood requests finished: prompts of
    # (728 − 198) / 12 = 44.17 tokens, outputs of (23,312 − 512) / 12 = 1,900.
    d = between("cpu-0.32/flood-mid.txt", "cpu-0.32/flood-after.txt", seconds=30.0)
    size = derive.request_tokens_at_completion(d)
    assert size == pytest.approx(530 / 12 + 1900)
    # The 4,096-token pool holds two requests of 1,944 tokens: the 11 running mid-flood are
    # 9 too many (floor(4,096 / 1,944.17 − 11) = floor(−8.89)), and 2 fit in an empty pool.
    assert derive.kv_cache_headroom_requests_at_completion(4096, 11, size) == -9
    assert derive.kv_cache_headroom_requests_at_completion(4096, 0, size) == 2
    # 2 running of 1,000 tokens in a pool of 10,000: 8 more.
    assert derive.kv_cache_headroom_requests_at_completion(10_000, 2, 1000.0) == 8


def test_headroom_at_completion_is_absent_until_a_request_finished_or_without_a_pool() -> None:
    # Idle to the flood's middle: only the two repetitive requests finished, 99 + 256.
    d = between("cpu-0.32/spec-idle.txt", "cpu-0.32/flood-mid.txt", seconds=30.0)
    assert derive.request_tokens_at_completion(d) == 355.0
    nothing_finished = between("cpu-0.32/spec-idle.txt", "cpu-0.32/spec-idle.txt", seconds=5.0)
    assert derive.request_tokens_at_completion(nothing_finished) is None
    assert derive.kv_cache_headroom_requests_at_completion(4096, 3, None) is None
    assert derive.kv_cache_headroom_requests_at_completion(0, 3, 355.0) is None  # asleep
    assert derive.kv_cache_headroom_requests_at_completion(None, 3, 355.0) is None
    assert derive.kv_cache_headroom_requests_at_completion(4096, None, 355.0) is None


# --- the first request after a start ------------------------------------------------------


def _prefill(name: str) -> tuple[float, float]:
    counters = read_snapshot(page(name)).engines[TINY].counters
    return counters[s.PREFILL_SUM], counters[s.PREFILL_COUNT]


def test_the_first_request_after_a_start_pays_the_ngram_jit_and_the_warm_mean_does_not() -> None:
    # Captured: the spec server right after start, then after one and two requests.
    first = derive.FirstRequests(*_prefill("cpu-0.32/spec-after-1x256.txt"), at=10.0)
    assert first.prefill_count == 1
    cold = derive.first_request_prefill_seconds(first)
    assert cold == pytest.approx(1.947, abs=1e-3)
    window = between("cpu-0.32/spec-idle.txt", "cpu-0.32/spec-after-2x256.txt", seconds=20.0)
    warm = derive.warm_request_prefill_seconds(window, first, window_start=0.0)
    second_sum = _prefill("cpu-0.32/spec-after-2x256.txt")[0] - first.prefill_sum
    assert warm == pytest.approx(second_sum)  # the second request alone
    assert warm is not None and cold > 20 * warm
    # Counted with the first request, the mean would hide the difference in between.
    assert derive.request_prefill_seconds(window) == pytest.approx((cold + warm) / 2)


def test_warm_mean_leaves_the_first_requests_out_only_when_the_window_holds_them() -> None:
    first = derive.FirstRequests(prefill_sum=2.0, prefill_count=1, at=100.0)
    d = Increase({s.PREFILL_SUM: 0.3, s.PREFILL_COUNT: 3}, 60.0)
    assert derive.warm_request_prefill_seconds(d, first, window_start=100.0) == pytest.approx(0.1)
    with_first = Increase({s.PREFILL_SUM: 2.2, s.PREFILL_COUNT: 3}, 60.0)
    assert derive.warm_request_prefill_seconds(with_first, first, 90.0) == pytest.approx(0.1)
    only_first = Increase({s.PREFILL_SUM: 2.0, s.PREFILL_COUNT: 1}, 60.0)
    assert derive.warm_request_prefill_seconds(only_first, first, 90.0) is None
    assert derive.first_request_prefill_seconds(None) is None


def test_load_bandwidth_is_weights_over_the_load_stage() -> None:
    assert derive.model_load_bytes_per_second(15.3e9, 0.5) == 30.6e9
    assert derive.model_load_bytes_per_second(None, 0.5) is None
    assert derive.model_load_bytes_per_second(15.3e9, None) is None
    assert derive.model_load_bytes_per_second(15.3e9, 0.0) is None


# --- numbers that cannot be are never published ---------------------------------------------


def test_tokens_per_engine_step_below_one_is_absent_not_published() -> None:
    # V0's 0-token observations: 1000 tokens over 1351 "steps" would read 0.74.
    d = Increase({s.GENERATION_TOKENS: 1000.0, s.ENGINE_STEPS: 1351.0}, 60.0)
    assert derive.tokens_per_engine_step(d) is None
    assert derive.weight_bytes_per_output_token(d, 15e9) is None  # would be 1.35× the model
    ok = Increase({s.GENERATION_TOKENS: 1000.0, s.ENGINE_STEPS: 1000.0}, 60.0)
    assert derive.tokens_per_engine_step(ok) == 1.0
    assert derive.weight_bytes_per_output_token(ok, 15e9) == 15e9


def test_physically_possible_is_one_rule_with_its_bounds_inclusive() -> None:
    assert derive.physically_possible(1.0, at_least=1.0) == 1.0
    assert derive.physically_possible(0.999, at_least=1.0) is None
    assert derive.physically_possible(1.0, at_most=1.0) == 1.0
    assert derive.physically_possible(1.001, at_most=1.0) is None
    assert derive.physically_possible(None, at_least=1.0) is None


def test_a_hybrid_pool_is_vllms_own_count_or_nothing() -> None:
    hybrid = s.CacheConfig(1600, 1000, 1, None, None, None, hybrid=True)
    assert derive.kv_cache_capacity_tokens(hybrid) is None  # 1000 × 1600 counts two groups
    assert derive.kv_cache_capacity_tokens(hybrid, 800_000) == 800_000
    plain = s.CacheConfig(16, 1000, 1, None, None, None)
    assert derive.kv_cache_capacity_tokens(plain, 900) == 16_000
    assert derive.kv_cache_capacity_tokens(plain, 900, hybrid=True) == 900  # the log says so
    counted = s.CacheConfig(1600, 1000, 1, 812_000, None, None, hybrid=True)
    assert derive.kv_cache_capacity_tokens(counted) == 812_000  # 0.24+: vLLM's own


def test_kv_memory_is_the_logged_figure_else_the_size_the_server_was_started_with() -> None:
    flagged = s.CacheConfig(128, 32, 1, None, 8388608, None)
    profiled = s.CacheConfig(16, 1000, 1, None, None, 0.9)
    assert derive.kv_cache_memory_bytes(flagged, None) == 8388608.0
    assert derive.kv_cache_memory_bytes(flagged, 35.07 * 2**30) == 35.07 * 2**30
    assert derive.kv_cache_memory_bytes(profiled, None) is None
    assert derive.kv_cache_memory_bytes(None, None) is None
