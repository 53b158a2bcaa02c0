"""A price and the GPU's own counters in explain: scenes written by hand, their costs and
shares worked out by hand here; one scene from Prometheus answers written by hand, with
dcgm-exporter's series shaped as in tests/fixtures/dcgm/."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.from_prometheus import scene_of
from vllm_glassbox.explain.promql import Answers, Selection, queries
from vllm_glassbox.explain.render import sentence
from vllm_glassbox.explain.scene import scene_from_json, scene_to_json

from tests.explain import scenes
from tests.explain.scenes import MIB, r
from tests.explain.test_diagnoses import only
from tests.explain.test_exporter import polled
from tests.explain.test_exporter import scene_of as exporter_scene

# The H200's BF16 run (scenes.bf16): a decode step of 1.7957383069999935 s / 381, reading
# 15,343,770,664.96 bytes of weights against a 4.8 TB/s peak; 384 tokens in 60 s.
STEP = 1.7957383069999935 / 381
SHARE = 15343770664.96 / STEP / 4.8e12  # 0.678…
# 3.6 an hour for 60 s is 0.06; over 384 tokens, per million: 156.25.
PER_MILLION = 3.6 * 60 / 3600 / 384 * 1e6


def _changes(f: Any) -> dict[str, float]:
    return {k: v.value for s in f.change for k, v in s.figures.items()}


def test_the_precision_what_if_is_priced_per_million_tokens_at_this_load() -> None:
    f = only(replace(scenes.bf16(), hourly_cost=r(3.6)), "decode")
    assert pytest.approx(156.25) == PER_MILLION
    # 8-bit weights halve the step, 4-bit quarter it: the cost of a token with them.
    costs = [s.figures["cost"].value for s in f.change if "cost" in s.figures]
    assert costs == [pytest.approx(156.25 / 2), pytest.approx(156.25 / 4)]
    assert "per million tokens at this load" in sentence(f.change[1])
    assert not any("gpu-hour-price" in u for u in f.unseen)


def test_without_a_price_the_what_if_is_as_before_and_says_what_would_price_it() -> None:
    f = only(scenes.bf16(), "decode")
    assert not any("cost" in s.figures for s in f.change)
    assert not any("per million" in sentence(s) for s in f.change)
    assert any("--gpu-hour-price" in u and "cost.gpuHourPrice" in u for u in f.unseen)


@pytest.mark.parametrize(
    ("dram", "words"),
    [
        (0.72, "agreeing with the weight reads"),  # 0.72 − 0.678 = 0.042, within 0.10
        (0.90, "misses a reader (KV cache reads"),  # 0.222 above
        (0.30, "the weights or the layout are misread"),  # 0.378 under
    ],
)
def test_dram_activity_is_set_beside_the_weight_reads(dram: float, words: str) -> None:
    f = only(replace(scenes.bf16(), dcgm_dram_active=r(dram)), "decode")
    assert f.what.figures["share"].value == pytest.approx(SHARE)
    assert f.what.figures["dram"].value == dram
    assert words in sentence(f.what)
    if "gap" in f.what.figures:
        assert f.what.figures["gap"].value == pytest.approx(dram - SHARE)
    assert not any("DRAM_ACTIVE" in u for u in f.unseen)


def test_without_dcgm_decode_says_it_could_not_see_the_gpus_own_counter() -> None:
    f = only(scenes.bf16(), "decode")
    assert "dram" not in f.what.figures
    assert any("DCGM_FI_PROF_DRAM_ACTIVE" in u for u in f.unseen)


def test_the_gpus_memory_comes_from_dcgm_and_a_given_one_wins() -> None:
    # The storm's pool by utilization 0.9 needs 3 MiB more (test_diagnoses): DCGM's
    # 40 MiB used + 24 MiB free is a 64 MiB GPU, so 0.9 + 3/64.
    scene = replace(
        scenes.storm(),
        kv_memory_fixed=False,
        gpu_memory_utilization=r(0.9),
        dcgm_fb_used=r(40),
        dcgm_fb_free=r(24),
    )
    f = only(scene, "kv_pool")
    assert f.change[-1].figures["utilization"].value == pytest.approx(0.9 + 3 / 64)
    assert not any("GPU's memory" in u for u in f.unseen)
    given = only(replace(scene, gpu_memory=r(128 * MIB)), "kv_pool")
    assert given.change[-1].figures["utilization"].value == pytest.approx(0.9 + 3 / 128)


def _calm(**more: Any) -> scenes.Scene:
    """Two engines of 4,096 tokens holding 2,457.6 tokens on the mean: 30 % full."""
    return replace(
        scenes.bf16(),
        scope=scenes.scope(engines=2),
        kv_capacity=r(4096),
        kv_used_mean=r(2457.6),
        kv_usage_peak=r(0.5),
        **more,
    )


def test_a_pool_running_30_percent_full_prices_the_room_no_request_uses() -> None:
    f = only(_calm(hourly_cost=r(8.0)), "idle")
    assert f.finding == "room_unused"
    # 2,457.6 / (2 × 4,096) = 0.3 full; 0.7 of 8.0 an hour: 5.6 an hour.
    assert f.what.figures["fill"].value == pytest.approx(0.3)
    assert f.what.figures["unused"].value == pytest.approx(0.7)
    assert f.what.figures["cost"].value == pytest.approx(5.6)
    assert "of the GPU's hours buy room no request uses" in sentence(f.what)


def test_no_room_is_priced_without_a_price_or_on_a_pool_mostly_used() -> None:
    assert not [f for f in explain(_calm()).findings if f.diagnosis == "idle"]
    fuller = replace(_calm(hourly_cost=r(8.0)), kv_used_mean=r(4915.2))  # 0.6 full
    assert not [f for f in explain(fuller).findings if f.diagnosis == "idle"]


def test_the_new_readings_travel_in_json() -> None:
    scene = _calm(hourly_cost=r(8.0), dcgm_fb_used=r(40), dcgm_fb_free=r(24))
    scene = replace(scene, dcgm_dram_active=r(0.5))
    assert scene_from_json(scene_to_json(scene)) == scene


SEL = Selection("http://prometheus.invalid", "team-a", None, 60.0, 1000.0)


def _answer(value: float, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1000.0, repr(value)]}


def _gpu(index: int, pod: str, model: str) -> dict[str, str]:
    """A GPU's labels as dcgm-exporter's Kubernetes mapping writes them (fixtures/dcgm),
    with the model_name the join to vLLM's pod adds."""
    return {
        "gpu": str(index),
        "UUID": f"GPU-0000000{index}",
        "Hostname": "node-1",
        "namespace": "team-a",
        "pod": pod,
        "model_name": model,
    }


def test_prometheus_scenes_take_the_gpu_and_the_price_of_each_models_pods() -> None:
    asked = queries(SEL)
    # One query for every model, joined to vLLM's pods on (namespace, pod).
    for name in ("dcgm_fb_used", "dcgm_fb_free", "dcgm_dram_active"):
        assert "DCGM_FI_" in asked[name] and "on (namespace, pod)" in asked[name]
        assert 'model_name="' not in asked[name]
    answered: dict[str, list[dict[str, Any]]] = {name: [] for name in asked}
    answered["dcgm_fb_used"] = [
        _answer(30000.0, **_gpu(1, "vllm-a-1", "a")),
        _answer(120000.0, **_gpu(0, "vllm-a-0", "a")),
        _answer(70000.0, **_gpu(2, "vllm-b-0", "b")),
    ]
    answered["dcgm_fb_free"] = [
        _answer(113000.0, **_gpu(1, "vllm-a-1", "a")),
        _answer(23000.0, **_gpu(0, "vllm-a-0", "a")),
    ]
    answered["dcgm_dram_active"] = [
        _answer(0.55, namespace="team-a", model_name="a"),
        _answer(0.2, namespace="team-a", model_name="b"),
    ]
    answered["hourly_cost"] = [_answer(7.0, namespace="team-a", model_name="a")]
    answers = Answers(asked, answered)
    a = scene_of(answers, ("team-a", "a"), SEL, None)
    # GPU 0 of vllm-a-0 first by its labels: 120,000 MiB used, 23,000 free.
    assert (a.dcgm_fb_used, a.dcgm_fb_free) == (
        r(120000.0, asked["dcgm_fb_used"]),
        r(23000.0, asked["dcgm_fb_free"]),
    )
    assert a.dcgm_dram_active == r(0.55, asked["dcgm_dram_active"])
    assert a.hourly_cost == r(7.0, asked["hourly_cost"])
    b = scene_of(answers, ("team-a", "b"), SEL, None)
    # b's GPU shows no free memory: no pair, no GPU memory; no price either.
    assert (b.dcgm_fb_used, b.dcgm_fb_free, b.hourly_cost) == (None, None, None)
    assert b.dcgm_dram_active is not None and b.dcgm_dram_active.value == 0.2


def test_the_exporter_scene_has_the_engines_hourly_cost_of_its_price() -> None:
    pages = ["cpu-0.32/spec-idle.txt", "cpu-0.32/spec-after-2x256.txt"]
    # One engine, TP 1: the price of one GPU hour is its hourly cost.
    priced = exporter_scene(polled(pages, "0.32.0", gpu_hour_price=3.6))
    assert priced.hourly_cost is not None and priced.hourly_cost.value == 3.6
    assert exporter_scene(polled(pages, "0.32.0")).hourly_cost is None
