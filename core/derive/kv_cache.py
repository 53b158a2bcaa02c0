"""The KV cache: one engine's pool (its capacity, what running requests hold, the
room left), when it runs out at its growth; and what would change it (another memory
budget, other weights, the requests that would fit).
"""

from __future__ import annotations

import math

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive.arithmetic import physically_possible, ratio
from vllm_glassbox.core.derive.increases import Increase

#: KV usage from which a pool counts as full: vLLM preempts once it cannot grow a running
#: request's blocks, which a pool of whole blocks reaches short of 100 %. The lab's acts,
#: the dashboards' threshold and VLLMKVCacheSaturated's (tests/rules/test_pool_full.py).
KV_POOL_FULL = 0.95


#: A pool full within this many seconds at its recent growth is about to run out:
#: VLLMKVCacheExhaustionForecast's threshold and the lab's judgement of the forecasts
#: (tests/rules/test_pool_full.py).
KV_EXHAUSTION_WARNING_SECONDS = 600.0


def kv_cache_blocks(cache: s.CacheConfig | None) -> int | None:
    """KV blocks of one engine: vLLM labels every engine with the sum over engines."""
    if cache is None or cache.num_gpu_blocks_total is None:
        return None
    return cache.num_gpu_blocks_total // max(cache.engines, 1)


def kv_cache_capacity_tokens(
    cache: s.CacheConfig | None, logged_tokens: int | None = None, hybrid: bool = False
) -> int | None:
    """Tokens one engine's KV pool holds: vLLM's own count on its page
    (`kv_cache_size_tokens`, 0.24+, right for hybrid models too), else blocks × block
    size, else what its startup log states ("KV cache size: N tokens").

    A hybrid model (the page's mamba labels or its log say so) shares every block between
    its layer groups, so blocks × block size overstates the pool by the number of groups:
    there only vLLM's own count is taken, from the page or the log, else none."""
    if cache is not None and cache.kv_cache_size_tokens is not None:
        return cache.kv_cache_size_tokens
    if hybrid or (cache is not None and cache.hybrid):
        return logged_tokens
    blocks = kv_cache_blocks(cache)
    if blocks is not None and cache is not None and cache.block_size is not None:
        return blocks * cache.block_size
    return logged_tokens


def kv_cache_memory_bytes(cache: s.CacheConfig | None, logged_bytes: float | None) -> float | None:
    """Memory one GPU gave its KV pool: what the startup log states ("Available KV cache
    memory"), else the `--kv-cache-memory-bytes` vLLM was started with (its cache config
    on the page), which sets the pool to exactly that size and skips the profiling that
    logs the figure (the CPU build's usual case)."""
    if logged_bytes is not None:
        return logged_bytes
    if cache is not None and cache.kv_cache_memory_bytes is not None:
        return float(cache.kv_cache_memory_bytes)
    return None


def engine_sleeping(awake: float | None) -> bool | None:
    """Whether vLLM's sleep mode put the engine to sleep: `engine_sleep_state{sleep_state=
    "awake"}` is 0 (vLLM 0.11.1+); None on a page without the family (older vLLM).

    Every way to sleep discards the KV pool: `/sleep?level=1` (weights offloaded to the
    CPU), `level=2` (weights discarded too), `/release_kv_cache_memory` (the pool alone);
    a `/wake_up` of some tags only (the weights) leaves vLLM's gauge at 0, and the pool
    still gone."""
    if awake is None:
        return None
    return awake < 0.5


def kv_cache_held_tokens(capacity_tokens: int | None, sleeping: bool | None) -> int | None:
    """Tokens the KV pool of an engine holds now: its capacity, 0 while it sleeps (the pool
    discarded, whatever `cache_config_info` still says the pool is when awake). 0, not
    absent, so that every sum of pools (a fleet's capacity, its usage) leaves the sleeping
    engines out without a filter; the free tokens of a pool of 0 are absent."""
    return 0 if sleeping else capacity_tokens


def kv_cache_used_tokens(usage: float | None, capacity_tokens: int | None) -> float | None:
    if usage is None or capacity_tokens is None:
        return None
    return usage * capacity_tokens


def kv_cache_free_tokens(used_tokens: float | None, capacity_tokens: int | None) -> float | None:
    """Tokens of the pool no running request holds: capacity − used; absent where there is
    no pool (a capacity of 0: an engine asleep), which has no room rather than a full one."""
    if used_tokens is None or capacity_tokens is None or capacity_tokens <= 0:
        return None
    return max(capacity_tokens - used_tokens, 0.0)


def kv_cache_mean_request_tokens(used_tokens: float | None, running: float | None) -> float | None:
    """The current mean size of a running request in the pool: used tokens / running."""
    if used_tokens is None or running is None or used_tokens <= 0:
        return None
    return ratio(used_tokens, running)


def kv_cache_headroom_requests(
    used_tokens: float | None, capacity_tokens: int | None, running: float | None
) -> float | None:
    """How many more requests of the current mean size fit in the pool (whole requests)."""
    free = kv_cache_free_tokens(used_tokens, capacity_tokens)
    mean = kv_cache_mean_request_tokens(used_tokens, running)
    if free is None or mean is None:
        return None
    fit = free / mean
    # A usage too small to be a float's (5e-324) makes the mean 0 in effect: no size.
    return float(math.floor(fit)) if math.isfinite(fit) else None


def request_tokens_at_completion(d: Increase) -> float | None:
    """The KV tokens a request holds when it finishes, as the requests that finished over
    the span held them: mean prompt + mean output (vLLM's request-size histograms, observed
    at completion). Absent until a request finished in the span."""
    prompt = ratio(d[s.REQUEST_PROMPT_SUM], d[s.REQUEST_PROMPT_COUNT])
    output = ratio(d[s.REQUEST_OUTPUT_SUM], d[s.REQUEST_OUTPUT_COUNT])
    if prompt is None or output is None:
        return None
    return prompt + output


def kv_cache_headroom_requests_at_completion(
    capacity_tokens: int | None, running: float | None, tokens_at_completion: float | None
) -> float | None:
    """How many more requests fit once every running request has grown to the size requests
    reach at completion: floor((capacity − running × size) / size), whole requests;
    negative when the running requests alone will outgrow the pool (that many too many).

    It prices a young request at what it will hold, not what it holds now
    (`kv_cache_headroom_requests`), so it reaches 0 while the pool still has room: the
    pool is promised. It assumes the running requests end like those that just finished,
    none ends early and none shares blocks (prefix caching makes it pessimistic)."""
    if capacity_tokens is None or capacity_tokens <= 0 or running is None:
        return None
    if tokens_at_completion is None or tokens_at_completion <= 0:
        return None
    return float(
        math.floor((capacity_tokens - running * tokens_at_completion) / tokens_at_completion)
    )


def kv_cache_exhaustion_seconds(
    free_tokens: float | None, used_growth_tokens: float, growth_seconds: float
) -> float | None:
    """Seconds until the pool is full at the window's growth of used tokens; absent unless
    used tokens grew."""
    rate = ratio(used_growth_tokens, growth_seconds)
    if free_tokens is None or rate is None or rate <= 0:
        return None
    return free_tokens / rate


def kv_cache_fill(used_tokens: float | None, capacity_tokens: float | None) -> float | None:
    """Share of the pool running requests hold: used tokens / capacity."""
    if used_tokens is None or capacity_tokens is None:
        return None
    return ratio(used_tokens, capacity_tokens)


def kv_cache_bytes_per_token(
    memory_bytes: float | None, capacity_tokens: float | None
) -> float | None:
    """KV memory of one GPU per token of its pool, as the pool was sized: what one more
    token of pool costs (all layers, this GPU's share of the KV heads)."""
    if memory_bytes is None or capacity_tokens is None:
        return None
    return ratio(memory_bytes, capacity_tokens)


def kv_cache_tokens_for_memory(
    memory_bytes: float | None, bytes_per_token: float | None, block_size: int | None = None
) -> int | None:
    """Tokens a pool of `memory_bytes` (one GPU's) holds: vLLM allocates whole blocks, so
    the tokens are rounded down to a whole number of blocks."""
    if memory_bytes is None or bytes_per_token is None or bytes_per_token <= 0:
        return None
    if memory_bytes <= 0:
        return 0
    tokens = math.floor(memory_bytes / bytes_per_token + 1e-9)
    if block_size:
        tokens -= tokens % block_size
    return tokens


def kv_cache_memory_for_tokens(
    tokens: float | None, bytes_per_token: float | None, block_size: int | None = None
) -> float | None:
    """Memory of one GPU a pool of at least `tokens` needs (whole blocks): what to give
    `--kv-cache-memory-bytes`."""
    if tokens is None or bytes_per_token is None or tokens < 0:
        return None
    whole = math.ceil(tokens - 1e-9)
    if block_size:
        whole = math.ceil(whole / block_size) * block_size
    return whole * bytes_per_token


def kv_cache_memory_with_weights(
    memory_bytes: float | None,
    weights_bytes: float | None,
    other_weights_bytes: float | None,
    shards: int = 1,
) -> float | None:
    """One GPU's KV memory when the model's weights weigh `other_weights_bytes` instead:
    under `--gpu-memory-utilization` vLLM gives the pool what the weights leave, so every
    byte of weights saved on a GPU (its 1/`shards` share, TP × PP) becomes KV cache."""
    if memory_bytes is None or weights_bytes is None or other_weights_bytes is None:
        return None
    return memory_bytes + (weights_bytes - other_weights_bytes) / max(shards, 1)


def kv_cache_memory_at_utilization(
    memory_bytes: float | None,
    utilization: float | None,
    other_utilization: float | None,
    gpu_memory_bytes: float | None,
) -> float | None:
    """One GPU's KV memory at another `--gpu-memory-utilization`: vLLM's budget is that
    share of the GPU's memory, and the pool gets what the budget gains or loses."""
    if (
        memory_bytes is None
        or utilization is None
        or other_utilization is None
        or gpu_memory_bytes is None
    ):
        return None
    return memory_bytes + (other_utilization - utilization) * gpu_memory_bytes


def gpu_memory_utilization_for(
    memory_bytes: float | None,
    current_memory_bytes: float | None,
    utilization: float | None,
    gpu_memory_bytes: float | None,
) -> float | None:
    """The `--gpu-memory-utilization` that gives one GPU's pool `memory_bytes` when
    `utilization` gave it `current_memory_bytes` (the inverse of
    `kv_cache_memory_at_utilization`); absent above 1, which no GPU has."""
    if (
        memory_bytes is None
        or current_memory_bytes is None
        or utilization is None
        or gpu_memory_bytes is None
    ):
        return None
    r = ratio(memory_bytes - current_memory_bytes, gpu_memory_bytes)
    return physically_possible(None if r is None else utilization + r, at_most=1.0)


def requests_that_fit(pool_tokens: float | None, request_tokens: float | None) -> float | None:
    """Whole requests of `request_tokens` each that a pool of `pool_tokens` holds."""
    if pool_tokens is None or request_tokens is None or request_tokens <= 0:
        return None
    return float(math.floor(pool_tokens / request_tokens + 1e-9))


def kv_cache_tokens_demanded(
    request_tokens: float | None, running: float | None, waiting: float | None
) -> float | None:
    """Pool tokens the running and the waiting requests hold together at `request_tokens`
    each (the current mean size, as the rules' replicas_needed counts them)."""
    if request_tokens is None or running is None or waiting is None:
        return None
    return request_tokens * (running + waiting)


def tokens_recomputed_by_preemptions(
    preemptions: float | None, request_tokens: float | None
) -> float | None:
    """Tokens vLLM computes again after preempting: a preempted request (vLLM V1) drops
    its KV cache and is prefilled again from its prompt and what it had generated; at
    the current mean size, each preemption costs one request's tokens."""
    if preemptions is None or request_tokens is None:
        return None
    return preemptions * request_tokens
