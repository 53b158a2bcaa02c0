"""The exporter's cost series against costs worked out by hand, on pages written by hand:
one engine, tensor-parallel 2 at 3.6 a GPU hour (7.2 an hour), polled every 5 s for 20 s.

Over the 20 s from the first poll to the last the engine costs 7.2 × 20 / 3600 = 0.04;
it generated 16,000 tokens (2.5 per million) and prefilled 80,000 (0.5 per million).
Running requests read 0, 2, 3, 0, 1: idle in 2 of 5 polls (0.4). KV usage read 0, 0.5,
0.5, 0, 0.5: the pool unused (1 + 0.5 + 0.5 + 1 + 0.5) / 5 = 0.7 of the time, which costs
7.2 × 0.7 = 5.04 an hour.
"""

from __future__ import annotations

import pytest
from prometheus_client.core import Metric
from vllm_glassbox.exporter.service import ExporterConfig, Poller

from tests.exporter.test_exposition_golden import Clock, PageSequence

GENERATED = (0, 4_000, 8_000, 12_000, 16_000)
PROMPT = (0, 20_000, 40_000, 60_000, 80_000)
RUNNING = (0, 2, 3, 0, 1)
USAGE = (0.0, 0.5, 0.5, 0.0, 0.5)


def _page(generated: int, prompt: int, running: int, usage: float) -> str:
    labels = 'engine="0",model_name="m"'
    return (
        "# TYPE vllm:generation_tokens_total counter\n"
        f"vllm:generation_tokens_total{{{labels}}} {generated}\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        f"vllm:prompt_tokens_total{{{labels}}} {prompt}\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{labels}}} 0\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}\n"
    )


def _values(price: float | None) -> dict[str, float]:
    config = ExporterConfig(
        target="http://vllm.invalid",
        interval_seconds=5.0,
        window_seconds=20.0,
        tensor_parallel=2,
        gpu_hour_price=price,
    )
    pages = [_page(*poll) for poll in zip(GENERATED, PROMPT, RUNNING, USAGE, strict=True)]
    clock = Clock()
    poller = Poller(config, fetcher=PageSequence(list(pages), "0.32.0"), clock=clock)
    for _ in pages:
        assert poller.poll_once()
        clock.now += 5.0
    families: list[Metric] = poller.published
    return {
        f.name: sample.value
        for f in families
        for sample in f.samples
        if f.name.startswith(("glassbox_cost", "glassbox_gpu_hour", "glassbox_engine_hourly"))
    }


def test_the_cost_series_by_hand() -> None:
    values = _values(3.6)
    assert values["glassbox_gpu_hour_price"] == 3.6
    assert values["glassbox_engine_hourly_cost"] == pytest.approx(7.2)
    assert values["glassbox_cost_per_million_generated_tokens"] == pytest.approx(2.5)
    assert values["glassbox_cost_per_million_prompt_tokens"] == pytest.approx(0.5)
    assert values["glassbox_cost_idle_ratio"] == pytest.approx(0.4)
    assert values["glassbox_cost_unused_pool_ratio"] == pytest.approx(0.7)
    assert values["glassbox_cost_unused_pool_hourly"] == pytest.approx(5.04)


def test_no_price_no_cost_series() -> None:
    assert _values(None) == {}
