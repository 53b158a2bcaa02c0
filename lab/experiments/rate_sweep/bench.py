"""`vllm bench serve` for one step: its flags from the phase, and the run of it."""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from vllm_glassbox.lab.backends.backend import Deployed
from vllm_glassbox.lab.experiments.rate_sweep.phase import RateSweepPhase
from vllm_glassbox.lab.vllm.client import LabError


def bench_args(
    phase: RateSweepPhase,
    deployed: Deployed,
    rate: float,
    requests: int,
    result_dir: Path,
    result_file: str,
) -> list[str]:
    """`vllm bench serve`'s flags for one step."""
    tokenizer = phase.tokenizer or deployed.model_dir
    args = [
        "--backend", "openai",
        "--base-url", deployed.url,
        "--endpoint", "/v1/completions",
        "--served-model-name", deployed.served_model_name,
        "--model", tokenizer or deployed.served_model_name,
        "--dataset-name", "random",
        "--random-input-len", str(phase.input_len),
        "--random-output-len", str(phase.output_len),
        "--random-range-ratio", "0",
        "--ignore-eos",
        "--num-prompts", str(requests),
        "--request-rate", f"{rate:g}",
        "--burstiness", "inf" if math.isinf(phase.burstiness) else f"{phase.burstiness:g}",
        "--temperature", f"{phase.temperature:g}",
        "--seed", str(phase.seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--disable-tqdm",
        "--save-result", "--save-detailed",
        "--result-dir", str(result_dir),
        "--result-filename", result_file,
    ]  # fmt: skip
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    if phase.max_concurrency:
        args += ["--max-concurrency", str(phase.max_concurrency)]
    if phase.goodput:
        args += ["--goodput", *(f"{k}:{v * 1000:g}" for k, v in phase.goodput.items())]
    return args


def run_bench(
    command: Sequence[str],
    args: Sequence[str],
    log_path: Path,
    timeout: float,
    api_key: str | None,
) -> None:
    """One benchmark run, its output in `log_path`; LabError when it fails or outlasts
    `timeout`. The API key goes in its environment (OPENAI_API_KEY), never its flags."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("OPENAI_API_KEY", None)
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*command, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise LabError(f"vllm bench serve exited with code {code} (log {log_path}):\n{tail}")
