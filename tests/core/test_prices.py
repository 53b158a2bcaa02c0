"""Prices of a GPU hour as the flag and the chart give them (core/prices.py): one price,
by GPU model, by node pool; and every bad price refused with a message naming it."""

from __future__ import annotations

import pytest
from vllm_glassbox.core.prices import parse_gpu_hour_prices, parse_rate


@pytest.mark.parametrize(
    ("text", "price"),
    [
        ("3.5", 3.5),
        ("3.5/h", 3.5),
        ("3.5/hour", 3.5),
        ("3.5 per hour", 3.5),
        ("0", 0.0),
        ("2.25/gpu-hour", 2.25),
        ("4e0", 4.0),
    ],
)
def test_one_price_of_a_gpu_hour(text: str, price: float) -> None:
    assert parse_rate(text) == price
    assert parse_gpu_hour_prices(text).for_server(None, None) == price
    assert parse_gpu_hour_prices(text).for_server("L40S", "any-pool") == price


def test_a_number_from_the_chart_is_a_price_too() -> None:
    assert parse_gpu_hour_prices(3.5).for_server(None, None) == 3.5
    assert parse_gpu_hour_prices(2).for_server("H200", None) == 2.0


def test_prices_by_gpu_model_reach_every_spelling_of_the_model() -> None:
    prices = parse_gpu_hour_prices("H200=3.5,A100=1.8,H100=2.9")
    assert prices.for_server("H200", None) == 3.5
    assert prices.for_server("NVIDIA H200", None) == 3.5  # nvidia-smi's name
    assert prices.for_server("a100", None) == 1.8
    assert prices.for_server("NVIDIA H100 80GB HBM3", None) == 2.9  # the datasheet's H100


def test_a_models_own_spelling_wins_over_another_spellings_datasheet_name() -> None:
    prices = parse_gpu_hour_prices("H100=2,H100-SXM=3")
    assert prices.for_server("H100", None) == 2.0
    assert prices.for_server("H100-SXM", None) == 3.0


def test_a_node_pool_price_comes_before_the_models() -> None:
    prices = parse_gpu_hour_prices("pool:spot-h200=1.2,H200=3.5")
    assert prices.for_server("H200", "spot-h200") == 1.2
    assert prices.for_server("H200", "on-demand") == 3.5
    assert prices.for_server(None, "spot-h200") == 1.2


@pytest.mark.parametrize(
    ("text", "named", "why"),
    [
        ("-1", "'-1'", "negative"),
        ("-0.5/h", "'-0.5/h'", "negative"),
        ("abc", "'abc'", "not a price"),
        ("", "", "empty"),
        ("3.5/min", "'3.5/min'", "per minute"),
        ("3.5 per minute", "'3.5 per minute'", "per minute"),
        ("0.001/s", "'0.001/s'", "per second"),
        ("per_second", "'per_second'", "per second"),
        ("84/day", "'84/day'", "per day"),
        ("3.5 per fortnight", "'3.5 per fortnight'", "not a price of one GPU hour"),
        ("inf", "'inf'", "not a price"),
        ("H200=3.5,A100=-1", "'-1'", "negative"),
        ("H200=3.5,A100=cheap", "'cheap'", "not a price"),
        ("H200=3.5,A100", "'A100'", "NAME=PRICE"),
        ("H200=3.5,H200=4", "'H200'", "named once"),
        ("pool:=3", "'pool:'", "named once"),
        ("H200=2/min", "'2/min'", "per minute"),
    ],
)
def test_a_bad_price_is_refused_naming_the_value(text: str, named: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_gpu_hour_prices(text)
    assert named in str(refused.value) and why in str(refused.value)


def test_a_map_without_the_servers_gpu_model_is_refused_naming_it() -> None:
    prices = parse_gpu_hour_prices("H200=3.5,A100=1.8")
    with pytest.raises(ValueError, match="no price for GPU model 'L40S'"):
        prices.for_server("L40S", None)
    with pytest.raises(ValueError, match="node pool 'gpu-a' or GPU model 'L4'"):
        prices.for_server("L4", "gpu-a")
    with pytest.raises(ValueError, match="say which this server runs on"):
        prices.for_server(None, None)
