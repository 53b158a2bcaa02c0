"""Each vLLM release run for real here (tests/fixtures/matrix/<version>/, captured by
scripts/capture-matrix.sh): what glassbox reads from its startup log and pages, and what
`glassbox exporter` published beside it, against the values worked out by hand from that
release's own counters.

The hand side never goes through glassbox's parsers: it sums the page's sample lines by
their exact names (each release's own: v0.11 and v0.14 name the decode-step histogram
twice, later releases once) and applies the definitions written out below.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core.cold_start import read_cold_starts
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.core.startup_log import read_facts
from vllm_glassbox.lab.backends.server_process import exceptions_in_log

from tests.fixtures import FIXTURES

MATRIX = FIXTURES / "matrix"
VERSIONS = sorted(p.parent.name for p in MATRIX.glob("*/startup.log"))
DP_VERSIONS = [v for v in VERSIONS if (MATRIX / v / "dp2-after-2x64.txt").exists()]

# The tiny model (lab.backends.tinymodel TinyModelSpec("tiny-capture")), by hand:
# KV bytes per token = 4 layers × 2 (K and V) × 2 KV heads × 64 dims × 2 bytes (BF16).
KV_BYTES_PER_TOKEN = 4 * 2 * 2 * 64 * 2
# Parameters: embeddings and LM head 2 × 1024 × 256, final norm 256, and per layer two
# norms 2 × 256, q and o 2 × 256², k and v 2 × (128 × 256 + 128), q's bias 256, MLP
# 3 × 704 × 256; two bytes each.
LAYER = 2 * 256 + 2 * 256**2 + 2 * (128 * 256 + 128) + 256 + 3 * 704 * 256
PARAMETERS = 2 * 1024 * 256 + 256 + 4 * LAYER
WEIGHTS_BYTES = 2 * PARAMETERS  # 6,955,520: the safetensors' tensor bytes
TINY = EngineKey("tiny", "0")

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def _text(version: str, name: str) -> str:
    return (MATRIX / version / name).read_text()


@cache
def _samples(version: str, name: str) -> list[tuple[str, str, float]]:
    """(name, labels text, value) of every sample line, read by hand."""
    out = []
    for line in _text(version, name).splitlines():
        if m := _SAMPLE.match(line):
            out.append((m["name"], m["labels"] or "", float(m["value"])))
    return out


def raw(version: str, page: str, name: str, engine: str | None = None) -> float:
    """The sum of the samples named exactly `name` (of one engine, if given)."""
    return sum(
        value
        for n, labels, value in _samples(version, page)
        if n == name and (engine is None or f'engine="{engine}"' in labels)
    )


def exported(version: str, page: str, name: str, /, **labels: str) -> float | None:
    """One sample of the exporter's page whose labels include `labels`."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    found = [
        value
        for n, text, value in _samples(version, page)
        if n == name and all(w in text.split(",") for w in wanted)
    ]
    assert len(found) <= 1, f"{name}{labels}: {found}"
    return found[0] if found else None


@dataclass(frozen=True)
class ByHand:
    """Counter increases of one engine, from the release's own sample names."""

    generated: float
    first_tokens: float
    ttft_sum: float
    itl_sum: float
    itl_count: float
    engine_steps: float
    drafts: float
    draft_tokens: float
    accepted: float

    def __add__(self, other: ByHand) -> ByHand:
        return ByHand(*(a + b for a, b in zip(self.values(), other.values(), strict=True)))

    def values(self) -> tuple[float, ...]:
        return tuple(self.__dict__.values())

    # The definitions, written out.
    @property
    def tpot(self) -> float:  # decode-step seconds per token made by decoding
        return self.itl_sum / (self.generated - self.first_tokens)

    @property
    def itl(self) -> float:  # one decode step of one sequence
        return self.itl_sum / self.itl_count

    @property
    def ttft(self) -> float:
        return self.ttft_sum / self.first_tokens

    @property
    def weight_bytes_per_token(self) -> float:  # every engine step reads every weight once
        return WEIGHTS_BYTES * self.engine_steps / self.generated

    @property
    def tokens_per_forward_pass(self) -> float:
        return (self.generated - self.first_tokens) / self.itl_count

    @property
    def tokens_per_engine_step(self) -> float:
        return self.generated / self.engine_steps

    @property
    def acceptance(self) -> float:
        return self.accepted / self.draft_tokens

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.accepted / self.drafts

    @property
    def draft_coverage(self) -> float:
        return self.drafts / self.itl_count


def itl_name(version: str, page: str) -> str:
    """The decode-step histogram: inter_token_latency_seconds where the page has it."""
    names = {n for n, _, _ in _samples(version, page)}
    current = "vllm:inter_token_latency_seconds"
    return current if f"{current}_sum" in names else "vllm:time_per_output_token_seconds"


def by_hand(version: str, before: str | None, after: str, engine: str = "0") -> ByHand:
    """Increase from page `before` (None: from zero, a fresh start) to page `after`."""

    def grew(name: str) -> float:
        start = raw(version, before, name, engine) if before else 0.0
        return raw(version, after, name, engine) - start

    itl = itl_name(version, after)
    return ByHand(
        generated=grew("vllm:generation_tokens_total"),
        first_tokens=grew("vllm:time_to_first_token_seconds_count"),
        ttft_sum=grew("vllm:time_to_first_token_seconds_sum"),
        itl_sum=grew(f"{itl}_sum"),
        itl_count=grew(f"{itl}_count"),
        engine_steps=grew("vllm:iteration_tokens_total_count"),
        drafts=grew("vllm:spec_decode_num_drafts_total"),
        draft_tokens=grew("vllm:spec_decode_num_draft_tokens_total"),
        accepted=grew("vllm:spec_decode_num_accepted_tokens_total"),
    )


def glassbox_increase(version: str, before: str, after: str) -> derive.Increase:
    snaps = [read_snapshot(_text(version, p)) for p in (before, after)]
    return derive.snapshot_increases(snaps[0], snaps[1], 1.0)[TINY]


def pool_tokens(version: str) -> int:
    """The pool the capture asked for, in tokens: --kv-cache-memory-bytes 33554432
    (16,384 tokens), or VLLM_CPU_KVCACHE_SPACE=1 (524,288) where the CPU build ignores
    the flag (capture.json)."""
    pool_bytes: int = json.loads(_text(version, "capture.json"))["kv_pool_bytes"]
    return pool_bytes // KV_BYTES_PER_TOKEN


# --- the startup log -----------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_the_startup_log_gives_version_pool_and_single_gpu_layout(version: str) -> None:
    text = _text(version, "startup.log")
    facts = read_facts(text)
    assert facts.vllm_version == version.removesuffix(".0") or facts.vllm_version == version
    # "GPU KV cache size: 524,288 tokens" (0.11, 0.14), "CPU KV cache size: …" (later).
    logged = re.search(r"KV cache size: ([\d,]+) tokens", text)
    assert logged is not None and int(logged[1].replace(",", "")) == pool_tokens(version)
    assert facts.kv_cache_tokens == pool_tokens(version)
    assert facts.max_model_len == 2048
    assert (facts.tensor_parallel, facts.pipeline_parallel) == (1, 1)
    assert facts.model_dtype == "bfloat16"
    assert facts.startups == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_a_restart_appended_to_the_log_is_a_second_start(version: str) -> None:
    text = _text(version, "restart.log")
    starts = read_cold_starts(text)
    assert len(starts) == 2
    assert read_facts(text).startups == 2
    assert read_facts(text).kv_cache_tokens == pool_tokens(version)
    for cold in starts:
        stages = derive.startup_stages(cold)
        # Each start's stages stack up to its own start-to-ready time.
        assert stages.total is not None and stages.total > 0
        assert sum(stages.by_stage().values()) == pytest.approx(stages.total)


# --- the pages, through the snapshot and the derivation core -----------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_the_pool_on_the_page_is_blocks_times_block_size(version: str) -> None:
    text = _text(version, "idle.txt")
    info = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.M)
    assert info is not None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info[1]))
    blocks, block_size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    assert blocks * block_size == pool_tokens(version)
    cache = read_snapshot(text).cache_for(TINY)
    assert derive.kv_cache_blocks(cache) == blocks
    assert derive.kv_cache_capacity_tokens(cache) == pool_tokens(version)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("before", "after"),
    [("idle.txt", "after-3x64.txt"), ("after-3x64.txt", "spec-after-2x256.txt")],
)
def test_decode_series_equal_the_hand_computation(version: str, before: str, after: str) -> None:
    hand = by_hand(version, before, after)
    d = glassbox_increase(version, before, after)
    assert derive.time_per_output_token(d) == pytest.approx(hand.tpot, rel=1e-12)
    assert derive.tokens_per_forward_pass(d) == pytest.approx(hand.tokens_per_forward_pass)
    assert derive.tokens_per_engine_step(d) == pytest.approx(hand.tokens_per_engine_step)
    if hand.draft_tokens:
        assert derive.spec_acceptance_ratio(d) == pytest.approx(hand.acceptance)
        assert derive.spec_mean_acceptance_length(d) == pytest.approx(hand.mean_acceptance_length)
        assert derive.spec_draft_coverage(d) == pytest.approx(hand.draft_coverage)


@pytest.mark.parametrize("version", VERSIONS)
def test_requests_of_64_tokens_count_as_sent(version: str) -> None:
    hand = by_hand(version, "idle.txt", "after-3x64.txt")
    assert (hand.generated, hand.first_tokens) == (3 * 64, 3)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_restart_starts_the_counters_again_from_zero(version: str) -> None:
    d = glassbox_increase(version, "spec-after-2x256.txt", "restart-after-1x64.txt")
    hand = by_hand(version, None, "restart-after-1x64.txt")
    assert (hand.generated, hand.first_tokens) == (64, 1)
    assert derive.time_per_output_token(d) == pytest.approx(hand.tpot)


# --- glassbox exporter, run beside the live server ---------------------------------------

# Each exporter page covers everything since the idle page (a one-hour window, from the
# exporter's first poll of the idle server); after the restart, both runs of the server.
EXPORTER_PAGES = {
    "after-3x64.txt": lambda v: by_hand(v, "idle.txt", "after-3x64.txt"),
    "spec-after-2x256.txt": lambda v: by_hand(v, "idle.txt", "spec-after-2x256.txt"),
    "restart-after-1x64.txt": lambda v: (
        by_hand(v, "idle.txt", "spec-after-2x256.txt") + by_hand(v, None, "restart-after-1x64.txt")
    ),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("page", list(EXPORTER_PAGES))
def test_the_exporter_publishes_the_hand_computed_series(version: str, page: str) -> None:
    hand = EXPORTER_PAGES[page](version)
    out = f"exporter-{page}"
    tiny = {"model_name": "tiny", "engine": "0"}
    assert exported(version, out, "glassbox_target_up") == 1.0
    assert exported(version, out, "glassbox_time_per_output_token_seconds", **tiny) == (
        pytest.approx(hand.tpot)
    )
    assert exported(version, out, "glassbox_tokens_per_forward_pass", **tiny) == (
        pytest.approx(hand.tokens_per_forward_pass)
    )
    assert exported(version, out, "glassbox_tokens_per_engine_step", **tiny) == (
        pytest.approx(hand.tokens_per_engine_step)
    )
    assert exported(version, out, "glassbox_inter_token_latency_seconds", **tiny) == (
        pytest.approx(hand.itl)
    )
    assert exported(version, out, "glassbox_time_to_first_token_seconds", **tiny) == (
        pytest.approx(hand.ttft)
    )
    assert exported(version, out, "glassbox_weight_bytes_per_output_token", **tiny) == (
        pytest.approx(hand.weight_bytes_per_token)
    )
    # One GPU (here a CPU) reads the whole model in one mean decode step (TP=1).
    assert exported(version, out, "glassbox_weight_read_bandwidth_bytes_per_second", **tiny) == (
        pytest.approx(WEIGHTS_BYTES / hand.itl)
    )
    # A rate over the window the exporter covered: steps = rate × seconds.
    steps_per_second = exported(version, out, "glassbox_engine_steps_per_second", **tiny)
    covered = exported(version, out, "glassbox_window_covered_seconds", **tiny)
    assert steps_per_second is not None and covered is not None
    assert steps_per_second * covered == pytest.approx(hand.engine_steps)
    if hand.draft_tokens:
        assert exported(version, out, "glassbox_spec_decode_acceptance_ratio", **tiny) == (
            pytest.approx(hand.acceptance)
        )
        assert exported(
            version, out, "glassbox_spec_decode_mean_acceptance_length", **tiny
        ) == pytest.approx(hand.mean_acceptance_length)
    capacity = exported(version, out, "glassbox_kv_cache_capacity_tokens", **tiny)
    assert capacity == pool_tokens(version)
    assert exported(version, out, "glassbox_model_weights_bytes") == WEIGHTS_BYTES
    assert exported(version, out, "glassbox_vllm_info", version=version) == 1.0
    layout = {"tensor_parallel": "1", "pipeline_parallel": "1", "data_parallel": "1"}
    assert exported(version, out, "glassbox_parallel_info", **layout) == 1.0
    restarts = 1.0 if page.startswith("restart") else 0.0
    assert exported(version, out, "glassbox_target_restarts_total") == restarts


# --- two data-parallel engines -------------------------------------------------------------


@pytest.mark.parametrize("version", DP_VERSIONS)
def test_each_data_parallel_engine_logs_the_whole_pool_and_model(version: str) -> None:
    text = _text(version, "dp2-startup.log")
    # Each engine logs its own pool: "… KV cache size: N tokens" once per engine.
    logged = [int(n.replace(",", "")) for n in re.findall(r"KV cache size: ([\d,]+) tokens", text)]
    assert logged == [pool_tokens(version)] * 2
    facts = read_facts(text)
    assert facts.kv_cache_tokens == pool_tokens(version)
    assert facts.tensor_parallel == 1


@pytest.mark.parametrize("version", DP_VERSIONS)
def test_two_requests_reach_the_engines_and_each_is_counted_once(version: str) -> None:
    # vLLM places each request on an engine (0.24.0 put both on engine 0): together
    # 2 × 64 tokens, 2 first tokens, 2 × 63 decode steps.
    engines = [by_hand(version, "dp2-idle.txt", "dp2-after-2x64.txt", e) for e in "01"]
    total = engines[0] + engines[1]
    assert (total.generated, total.first_tokens, total.itl_count) == (128, 2, 126)


@pytest.mark.parametrize("version", DP_VERSIONS)
@pytest.mark.parametrize("engine", ["0", "1"])
def test_each_engine_by_hand_and_by_the_exporter(version: str, engine: str) -> None:
    hand = by_hand(version, "dp2-idle.txt", "dp2-after-2x64.txt", engine)
    snaps = [read_snapshot(_text(version, p)) for p in ("dp2-idle.txt", "dp2-after-2x64.txt")]
    d = derive.snapshot_increases(snaps[0], snaps[1], 1.0)[EngineKey("tiny", engine)]
    out = "exporter-dp2-after-2x64.txt"
    labels = {"model_name": "tiny", "engine": engine}
    tpot = exported(version, out, "glassbox_time_per_output_token_seconds", **labels)
    per_pass = exported(version, out, "glassbox_tokens_per_forward_pass", **labels)
    if hand.generated == 0:  # an engine that served nothing: no TPOT at all, not 0
        assert derive.time_per_output_token(d) is None
        assert (tpot, per_pass) == (None, None)
    else:
        assert derive.time_per_output_token(d) == pytest.approx(hand.tpot)
        assert derive.tokens_per_forward_pass(d) == 1.0 == hand.tokens_per_forward_pass
        assert tpot == pytest.approx(hand.tpot)
        assert per_pass == 1.0
    capacity = exported(version, out, "glassbox_kv_cache_capacity_tokens", **labels)
    assert capacity == pool_tokens(version)


@pytest.mark.parametrize("version", DP_VERSIONS)
def test_the_exporter_sees_two_engines_of_one_whole_model(version: str) -> None:
    out = "exporter-dp2-after-2x64.txt"
    layout = {"tensor_parallel": "1", "pipeline_parallel": "1", "data_parallel": "2"}
    assert exported(version, out, "glassbox_parallel_info", **layout) == 1.0
    # One engine's copy is the model: the weights are not summed over the engines.
    assert exported(version, out, "glassbox_model_weights_bytes") == WEIGHTS_BYTES


def test_the_matrix_holds_every_release_run_here() -> None:
    assert {"0.11.0", "0.14.1", "0.24.0", "0.32.0"} <= set(VERSIONS)


# Each start, read off the logs by hand: the server-version line (or banner) to "Starting
# vLLM (API) server … on", "Loading weights took S seconds", "init engine (profile, create
# kv cache, warmup model) took S s"; with two engines, the slowest engine's. No release's
# CPU build logs a compile or graph-capture time, so the init-engine line is the
# engine_init stage whole, and other is the rest.
@dataclass(frozen=True)
class Start:
    total: float
    weights_load: float
    engine_init: float


STARTS = {  # the spec server's two starts (restart.log), first then second
    "0.11.0": (Start(324, 0.19, 229.09), Start(186, 0.33, 75.11)),  # 10:46:24 → 10:51:48
    "0.14.1": (Start(248, 0.10, 181.68), Start(176, 0.13, 79.24)),  # 10:40:54 → 10:45:02
    "0.24.0": (Start(306, 0.03, 181.65), Start(254, 0.04, 113.94)),  # 10:39:14 → 10:44:20
    "0.32.0": (Start(290, 0.05, 165.06), Start(199, 0.05, 80.87)),  # 10:23:33 → 10:28:23
}
DP_STARTS = {  # each engine's weights and init engine, then the slowest
    "0.11.0": Start(115, max(0.03, 0.09), max(3.09, 3.21)),  # 10:57:49 → 10:59:44
    "0.14.1": Start(193, max(0.07, 0.06), max(6.40, 4.97)),  # 10:50:13 → 10:53:26
    "0.24.0": Start(419, max(0.02, 0.01), max(75.14, 52.13)),  # 10:50:22 → 10:57:21
    "0.32.0": Start(285, max(0.02, 0.05), max(0.03, 0.10)),  # 10:33:49 → 10:38:34
}


def _assert_stages(stages: derive.StartupStages, hand: Start) -> None:
    assert stages.total == hand.total
    assert stages.weights_load == pytest.approx(hand.weights_load)
    assert stages.engine_init == pytest.approx(hand.engine_init)
    assert (stages.compile, stages.cuda_graphs) == (None, None)
    assert stages.other == pytest.approx(hand.total - hand.weights_load - hand.engine_init)


def _assert_exported_stages(version: str, page: str, hand: Start) -> None:
    stage = "glassbox_startup_stage_seconds"
    assert exported(version, page, "glassbox_startup_seconds") == hand.total
    assert exported(version, page, stage, stage="weights_load") == hand.weights_load
    assert exported(version, page, stage, stage="engine_init") == pytest.approx(hand.engine_init)
    other = hand.total - hand.weights_load - hand.engine_init
    assert exported(version, page, stage, stage="other") == pytest.approx(other)
    # The weights (6,955,520 bytes) over the weights_load stage.
    load_rate = exported(version, page, "glassbox_model_load_bytes_per_second")
    assert load_rate == pytest.approx(WEIGHTS_BYTES / hand.weights_load)


@pytest.mark.parametrize("version", sorted(STARTS))
def test_each_start_by_stage_equals_the_log_read_by_hand(version: str) -> None:
    [cold] = read_cold_starts(_text(version, "startup.log"))
    _assert_stages(derive.startup_stages(cold), STARTS[version][0])
    starts = read_cold_starts(_text(version, "restart.log"))
    for cold, hand in zip(starts, STARTS[version], strict=True):
        _assert_stages(derive.startup_stages(cold), hand)


@pytest.mark.parametrize("version", sorted(STARTS))
def test_the_exporter_publishes_the_latest_start_by_stage(version: str) -> None:
    first, second = STARTS[version]
    _assert_exported_stages(version, "exporter-after-3x64.txt", first)
    _assert_exported_stages(version, "exporter-restart-after-1x64.txt", second)


#: The exporter that ran beside 0.24.0's data-parallel start kept the last engine's
#: "init engine" line (52.13 s) instead of the slowest's (75.14 s, logged first); its page is
#: kept as captured, and the parser, fixed since, is held to the hand values above.
_CAPTURED_BEFORE_THE_SLOWEST_ENGINE_RULE = {"0.24.0"}


@pytest.mark.parametrize("version", sorted(DP_STARTS))
def test_a_data_parallel_start_takes_as_long_as_its_slowest_engine(version: str) -> None:
    [cold] = read_cold_starts(_text(version, "dp2-startup.log"))
    _assert_stages(derive.startup_stages(cold), DP_STARTS[version])
    if version not in _CAPTURED_BEFORE_THE_SLOWEST_ENGINE_RULE:
        _assert_exported_stages(version, "exporter-dp2-after-2x64.txt", DP_STARTS[version])


def test_v0_11_names_the_decode_step_histogram_twice_with_the_same_observations() -> None:
    # time_per_output_token_seconds (deprecated) and inter_token_latency_seconds: glassbox
    # reads the second; on this page both say 189 steps of 11.82 s in all.
    for suffix in ("_sum", "_count"):
        old = raw("0.11.0", "after-3x64.txt", f"vllm:time_per_output_token_seconds{suffix}")
        new = raw("0.11.0", "after-3x64.txt", f"vllm:inter_token_latency_seconds{suffix}")
        assert old == new > 0


@pytest.mark.parametrize(
    ("version", "cause"),
    [
        ("0.11.0", "AssertionError: spec decode is not supported."),
        ("0.14.1", "AssertionError: spec decode is not supported."),
        (
            "0.24.0",
            "TypeError: _sample_recovered_tokens_kernel_impl() got an unexpected keyword "
            "argument 'USE_FP64_GUMBEL'",
        ),
    ],
)
def test_a_refused_start_is_told_by_its_root_cause_not_its_last_line(
    version: str, cause: str
) -> None:
    # The engine core's exception sits behind its process prefix and colours; the log's
    # last line only says "Engine core initialization failed. See root cause above."
    found = exceptions_in_log(_text(version, "spec-refused.log"))
    assert found[0] == cause
    assert found[-1].startswith("RuntimeError: Engine core initialization failed.")
