"""The arithmetic every phase kind shares: pure functions over snapshots, increases and
startup logs.

Every per-request number is a function of the derivation core (`core/derive/`);
this module gathers them: the facts of one server start, the numbers of some measured
requests, and a segment's numbers to compare with the exporter's (by the exporter's own
catalogue and derivation context, `core/series.py`). A kind's own
arithmetic (a variant, a point of the KV-pressure timeline) is in its module
(`lab/experiments/`); what the numbers mean — medians, the fitted line, acts, speed-ups —
is `findings.py` and the kinds' judgements.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from vllm_glassbox.core import derive, series
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.cold_start import latest_start
from vllm_glassbox.core.derive import Increase
from vllm_glassbox.core.layout import resolve_layout
from vllm_glassbox.core.snapshot import Snapshot, first_cache
from vllm_glassbox.core.startup_log import read_facts
from vllm_glassbox.core.units import GIB
from vllm_glassbox.core.weights import (
    Weights,
    estimate_from_config,
    read_checkpoint_weights,
    resolve_weights,
)
from vllm_glassbox.lab.compared import COMPARED
from vllm_glassbox.lab.results import RequestStats, Startup
from vllm_glassbox.lab.vllm.client import Completion

# --- one server start ----------------------------------------------------------------------


def checkpoint_weights(model_dir: str | None) -> Weights | None:
    """Weights from a readable checkpoint directory (safetensors headers, else config)."""
    if not model_dir or not Path(model_dir).is_dir():
        return None
    try:
        return read_checkpoint_weights(model_dir)
    except (OSError, ValueError):
        return None


def startup_facts(
    startup_log: str,
    snapshot: Snapshot | None,
    served_model_name: str,
    startup_seconds: float,
    checkpoint: Callable[[], Weights | None] = lambda: None,
    log_path: str | None = None,
    model_dir: str | None = None,
) -> Startup:
    """Weights, KV memory and tokens, blocks and block size of the server just started.

    Weights, the KV pool and its memory as the exporter resolves them (the same
    functions): weights from the log (what was loaded, the whole model; absent on CPU),
    then the checkpoint, with a mixture-of-experts checkpoint's active weights; KV tokens
    from the cache config, then the log; KV memory from the log's "Available KV cache
    memory", else the `--kv-cache-memory-bytes` the server was started with. The
    quantization vLLM applies from its engine-config line, else the checkpoint's config.
    """
    facts = read_facts(startup_log)
    stages = startup_stages(startup_log)
    engines = len(snapshot.engines) if snapshot is not None else None
    layout = resolve_layout(facts, engines=engines)
    weights = resolve_weights(None, facts, checkpoint(), layout)
    cache = first_cache(snapshot)
    kv_tokens = derive.kv_cache_capacity_tokens(cache, facts.kv_cache_tokens, facts.hybrid_kv)
    return Startup(
        served_model_name=served_model_name,
        startup_seconds=startup_seconds,
        weights_bytes=weights.bytes if weights else None,
        weights_source=weights.source if weights else None,
        load_seconds=stages.get("weights_load"),
        kv_cache_memory_bytes=derive.kv_cache_memory_bytes(cache, facts.kv_cache_memory_bytes),
        kv_cache_tokens=kv_tokens,
        kv_cache_blocks=derive.kv_cache_blocks(cache),
        block_size=cache.block_size if cache else None,
        vllm_version=facts.vllm_version,
        log_path=log_path,
        quantization=engine_quantization(startup_log) or config_quantization(model_dir),
        load_format=engine_setting(startup_log, "load_format"),
        unquantized_bytes=unquantized_weights(model_dir),
        stages=stages,
        default_repetition_penalty=generation_default(model_dir, "repetition_penalty"),
        tensor_parallel=layout.tensor,
        active_weights_bytes=weights.active_bytes if weights else None,
    )


def startup_stages(startup_log: str) -> dict[str, float]:
    """The latest start's stages as the exporter reads them (`derive.startup_stages`);
    a stage the version does not log is absent."""
    start = latest_start(startup_log)
    return derive.startup_stages(start).by_stage() if start else {}


def engine_setting(startup_log: str, key: str) -> str | None:
    """A setting of vLLM's latest engine-config line ("Initializing a V1 LLM engine
    (v0.24.0) with config: …, quantization=fp8, load_format=dummy, …"); None when absent
    or None."""
    found = re.findall(rf"LLM engine .*?\b{key}=(?P<value>[A-Za-z0-9_.\-]+)", startup_log)
    value = found[-1] if found else None
    return None if value in (None, "None") else value


def engine_quantization(startup_log: str) -> str | None:
    """What vLLM says it quantizes the weights with; None when unquantized."""
    return engine_setting(startup_log, "quantization")


def _model_config(model_dir: str | None, name: str) -> dict[str, object]:
    if not model_dir:
        return {}
    try:
        data = json.loads((Path(model_dir) / name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def config_quantization(model_dir: str | None) -> str | None:
    quant = _model_config(model_dir, "config.json").get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return str(method) if method else None


def unquantized_weights(model_dir: str | None) -> float | None:
    """The checkpoint's shape at 16 bits (the core's estimate from config.json, without
    its quantization_config)."""
    config = _model_config(model_dir, "config.json")
    if not config:
        return None
    plain = {k: v for k, v in config.items() if k != "quantization_config"}
    try:
        return float(estimate_from_config({**plain, "torch_dtype": "bfloat16"}))
    except ValueError:
        return None


def generation_default(model_dir: str | None, key: str) -> float | None:
    value = _model_config(model_dir, "generation_config.json").get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# --- requests ------------------------------------------------------------------------------


def request_stats(completions: Sequence[Completion], d: Increase) -> RequestStats:
    """Everything the core derives from the increase around some requests."""
    return RequestStats(
        requests=len(completions),
        prompt_tokens=sum(c.prompt_tokens for c in completions),
        generated_tokens=d[s.GENERATION_TOKENS],
        wall_seconds=sum(c.wall_seconds for c in completions),
        ttft_seconds=derive.time_to_first_token(d),
        tpot_seconds=derive.time_per_output_token(d),
        inter_token_latency_seconds=derive.inter_token_latency(d),
        forward_passes=d[s.ITL_COUNT],
        tokens_per_forward_pass=derive.tokens_per_forward_pass(d),
        decode_seconds=d[s.ITL_SUM],
        # vLLM's request_prefill_time_seconds over these requests (the exporter's warm
        # prefill series, without its first requests left out).
        prefill_seconds=derive.request_prefill_seconds(d),
        engine_steps=d[s.ENGINE_STEPS],
        drafts=d[s.SPEC_DRAFTS],
        draft_tokens=d[s.SPEC_DRAFT_TOKENS],
        accepted_tokens=d[s.SPEC_ACCEPTED],
        acceptance_ratio=derive.spec_acceptance_ratio(d),
        draft_coverage=derive.spec_draft_coverage(d),
    )


# --- one whole segment, as the exporter beside it saw it -----------------------------------


def segment_values(
    d: Increase, startup: Startup | None, peak: float | None
) -> dict[str, float | None]:
    """The compared series over the segment, computed by the lab from its own snapshots
    (same span) as the exporter computes them: a windowed series by the catalogue's
    function with the exporter's derivation context, the weights and the KV pool as the
    server's start resolved them."""
    context = series.derivation_context(
        startup.weights if startup else None, peak, startup.tensor_parallel if startup else 1
    )
    kv_tokens = startup.kv_cache_tokens if startup else None
    resolved = {
        series.WEIGHTS_BYTES.name: startup.weights_bytes if startup else None,
        series.KV_CAPACITY.name: None if kv_tokens is None else float(kv_tokens),
    }
    return {
        c.name: (
            c.family.compute(d, context)
            if isinstance(c.family, series.WindowedSeries)
            else resolved[c.name]
        )
        for c in COMPARED
    }


def gib(value: float | None) -> float | None:
    return None if value is None else value / GIB
