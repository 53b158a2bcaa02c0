"""Startup facts from vLLM's log in every format since v0.11 (exporter/startup_log.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm_glassbox.exporter.startup_log import GIB, LogFollower, StartupFacts, read_facts

from tests.fixtures import log


def test_real_cpu_log_has_kv_tokens_and_concurrency_but_no_weights_line() -> None:
    facts = read_facts(log("cpu-0.32-plain-startup.log"))
    assert facts.vllm_version == "0.32.0"
    assert facts.startups == 1
    # --kv-cache-memory-bytes 33554432 at 2,048 bytes per token of the tiny model.
    assert facts.kv_cache_tokens == 16384
    assert (facts.max_model_len, facts.max_concurrency) == (2048, 8.0)
    assert facts.weights_bytes is None  # the CPU build never logs "Model loading took"
    assert facts.weights_load_seconds is not None and facts.weights_load_seconds < 60


def test_real_cpu_log_of_the_small_pool() -> None:
    facts = read_facts(log("cpu-0.32-spec-startup.log"))
    assert facts.kv_cache_tokens == 4096
    assert (facts.max_model_len, facts.max_concurrency) == (2048, 2.0)


def test_v0_11_ansi_prefix_and_one_weights_line_per_tp_rank_are_summed() -> None:
    text = log("v0.11.0-tp2.log")
    assert "\x1b[1;36m(Worker_TP1 pid=421)\x1b[0;0m" in text
    facts = read_facts(text)
    assert facts.vllm_version == "0.11.0"
    assert facts.weights_by_rank == {
        "Worker_TP0:420": 2.6037 * GIB,
        "Worker_TP1:421": 2.6037 * GIB,
    }
    assert facts.weights_bytes == pytest.approx(2 * 2.6037 * GIB)  # AWQ 7B over TP=2
    assert facts.model_load_seconds == 4.118342
    assert facts.kv_cache_memory_bytes == pytest.approx(35.07 * GIB)
    assert facts.kv_cache_tokens == 1_313_328
    assert (facts.max_model_len, facts.max_concurrency) == (32768, 40.08)
    assert facts.startups == 1


def test_v0_13_gib_memory_format() -> None:
    facts = read_facts(log("v0.13.0.log"))
    assert facts.weights_bytes == pytest.approx(5.2073 * GIB)
    assert facts.model_load_seconds == 2.901173
    assert facts.kv_cache_memory_bytes == pytest.approx(34.12 * GIB)
    assert (facts.kv_cache_tokens, facts.max_concurrency) == (638_880, 19.50)


def test_v0_14_rounded_gib_format() -> None:
    facts = read_facts(log("v0.14.0.log"))
    assert facts.weights_bytes == pytest.approx(5.21 * GIB)
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
    assert facts.weights_bytes == pytest.approx(5.21 * GIB)


def test_restart_in_the_log_keeps_only_the_latest_startup() -> None:
    facts = read_facts(log("v0.14.0-restart.log"))
    assert facts.startups == 2
    assert facts.kv_cache_tokens == 66_672
    assert facts.kv_cache_memory_bytes == pytest.approx(3.56 * GIB)
    assert facts.model_load_seconds == 2.731021
    assert facts.weights_bytes == pytest.approx(5.21 * GIB)  # not 2 × 5.21


def test_a_new_startup_clears_facts_until_the_new_ones_are_logged() -> None:
    text = log("v0.14.0.log")
    facts = read_facts(text)
    assert facts.kv_cache_tokens is not None
    restarted = facts.feed(text.splitlines()[0])  # the server-version line again
    assert restarted.startups == 2
    assert restarted.kv_cache_tokens is None
    assert restarted.weights_bytes is None
    assert restarted.kv_cache_memory_bytes is None


def test_the_same_rank_loading_weights_again_is_a_restart() -> None:
    line = "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [x.py:1] Model loading took 2 GiB memory"
    facts = read_facts("\n".join([line, "... GPU KV cache size: 1,024 tokens", line]))
    assert facts.weights_bytes == 2 * GIB
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
