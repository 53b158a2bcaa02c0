"""The pool's forecasts the KV-pressure and rate-sweep kinds judge: computed by the
derivation core over the lab's polls (checked against hand arithmetic on hand-written and
captured pages), read from the exporter's page, and judged against the first preemption:
the lead, the false alarms, a series never present. And the benchmark's per-request
fields of several vLLM versions, from which the sweep judges a step."""

from __future__ import annotations

import dataclasses
import gzip
import json
import statistics
from typing import Any

import pytest
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.core.snapshot import read_snapshot
from vllm_glassbox.lab.experiments.pool_forecasts import (
    FALSE_ALARM_GRACE_SECONDS,
    Forecaster,
    ForecastPoint,
    PoolForecast,
    exporter_forecast,
    forecast_table,
    judge_forecasts,
    verdict,
)
from vllm_glassbox.lab.experiments.rate_sweep.judge import keeps_up, unjudged_reason
from vllm_glassbox.lab.experiments.rate_sweep.views import client_view, request_latencies

from tests.fixtures import FIXTURES
from tests.fixtures import page as fixture_page


def _page(usage: float, running: int, finished: int, prompt: float, output: float) -> str:
    e = 'engine="0",model_name="m"'
    return "".join(
        f"{line}\n"
        for line in (
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{e}}} {running}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{e}}} {usage}",
            "# TYPE vllm:request_prompt_tokens histogram",
            f"vllm:request_prompt_tokens_sum{{{e}}} {prompt}",
            f"vllm:request_prompt_tokens_count{{{e}}} {finished}",
            "# TYPE vllm:request_generation_tokens histogram",
            f"vllm:request_generation_tokens_sum{{{e}}} {output}",
            f"vllm:request_generation_tokens_count{{{e}}} {finished}",
        )
    )


def test_the_labs_forecasts_of_a_filling_pool_by_hand() -> None:
    # A 16,384-token pool. Since the baseline 2 requests finished, prompts of 50 tokens
    # and outputs of 200: 250 tokens at completion. Used: 4,096 tokens, 10 s later 8,192.
    baseline = read_snapshot(_page(0.0, 0, 0, 0, 0))
    forecaster = Forecaster(baseline, 16384)
    first = forecaster.at(100.0, read_snapshot(_page(0.25, 4, 2, 100, 400)), 10.0)
    assert first.exhaustion_seconds is None  # one poll: no growth yet
    now = forecaster.at(110.0, read_snapshot(_page(0.5, 8, 2, 100, 400)), 20.0)
    # 8 requests hold 8,192: 1,024 each, 8,192 free: 8 more of that size.
    assert now.headroom_requests == 8
    # floor((16,384 − 8 × 250) / 250) = floor(57.5)
    assert now.headroom_at_completion == 57
    # 8,192 free at 4,096 tokens per 10 s.
    assert now.exhaustion_seconds == pytest.approx(20.0)


def test_the_captured_flood_is_promised_more_than_its_pool_only_once_its_requests_finish() -> None:
    # Captured (vLLM 0.32, a 4,096-token pool): before the flood's middle only the two
    # repetitive requests had finished (99 + 256 = 355 tokens each); 11 run mid-flood.
    forecaster = Forecaster(read_snapshot(fixture_page("cpu-0.32/spec-idle.txt")), 4096)
    mid = forecaster.at(0.0, read_snapshot(fixture_page("cpu-0.32/flood-mid.txt")), 30.0)
    assert (mid.headroom_requests, mid.headroom_at_completion) == (0, 0)  # floor(0.54)
    # From the flood's middle to its end the flood's own 12 finished: 1,944.2 tokens each.
    later = Forecaster(read_snapshot(fixture_page("cpu-0.32/flood-mid.txt")), 4096)
    after = later.at(0.0, read_snapshot(fixture_page("cpu-0.32/flood-after.txt")), 30.0)
    assert after.headroom_at_completion == 2  # nothing runs: two such requests fit


def test_the_exporters_forecasts_add_headroom_and_take_the_engine_that_fills_first() -> None:
    page = ExporterPage.parse(
        "# TYPE glassbox_kv_cache_headroom_requests gauge\n"
        'glassbox_kv_cache_headroom_requests{engine="0",model_name="m"} 3\n'
        'glassbox_kv_cache_headroom_requests{engine="1",model_name="m"} 4\n'
        "# TYPE glassbox_kv_cache_headroom_requests_at_completion gauge\n"
        'glassbox_kv_cache_headroom_requests_at_completion{engine="0",model_name="m"} -2\n'
        'glassbox_kv_cache_headroom_requests_at_completion{engine="1",model_name="m"} 5\n'
        "# TYPE glassbox_kv_cache_exhaustion_seconds gauge\n"
        'glassbox_kv_cache_exhaustion_seconds{engine="1",model_name="m"} 42\n'
    )
    assert exporter_forecast(page) == PoolForecast(7, -2, 42)
    assert exporter_forecast(ExporterPage({})) == PoolForecast()


def _points(*polls: tuple[float, bool, float | None]) -> list[ForecastPoint]:
    """(t, preempted, exhaustion seconds); the running requests promised more than the
    pool throughout (headroom at completion −1), the headroom never 0."""
    return [
        ForecastPoint(t, preempted, PoolForecast(5, -1, soon), PoolForecast())
        for t, preempted, soon in polls
    ]


def test_a_forecast_leads_from_the_warning_the_preemption_came_in_and_counts_its_false_alarms() -> (
    None
):
    points = _points(
        (0, False, 300),  # a rise that drains again: a false alarm
        (2, False, None),
        (100, False, None),
        (102, False, 500),  # the warning the preemption came in
        (104, False, 40),
        (106, True, 0),
    )
    judged = judge_forecasts(points)
    assert judged.first_preemption_at == 106
    soon = judged.check("time to exhaustion")
    assert soon is not None
    assert (soon.warned_at, soon.lead_seconds) == (102, 4.0)
    assert (soon.warnings, soon.false_alarms, soon.polls_seen) == (2, 1, 4)
    # The alert's condition: both, at the same polls here.
    alert = judged.check("forecast alert")
    assert alert is not None and alert.lead_seconds == 4.0
    # The headroom never reached 0; the exporter showed nothing at all.
    headroom = judged.check("headroom")
    assert headroom is not None and (headroom.warnings, headroom.lead_seconds) == (0, None)
    silent = judged.check("time to exhaustion", "exporter")
    assert silent is not None and (silent.polls_seen, silent.warnings) == (0, 0)
    assert verdict(judged) == (
        "yes: the lab's headroom at completion warned 106.0 s before the first preemption "
        "(0 false alarm(s) in 1 warning(s))"
    )
    table = "\n".join(forecast_table(judged))
    assert (
        "| time to exhaustion | full within 600 s at the recent growth | lab (derivation core) "
        in table
    )
    assert "| exporter | never present | 0 | 0 | 0 |" in table


def test_a_warning_over_long_before_the_preemption_does_not_lead_it() -> None:
    grace = FALSE_ALARM_GRACE_SECONDS
    points = _points((0, False, 100), (1, False, None), (grace + 5, True, None))
    soon = judge_forecasts(points).check("time to exhaustion")
    assert soon is not None and (soon.lead_seconds, soon.false_alarms) == (None, 1)
    assert verdict(judge_forecasts(_points((0, False, None)))) == "no preemption happened"


# --- the benchmark's per-request fields, version by version ----------------------------------


def _bench(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / "bench" / name).read_text()))


def test_a_latency_is_the_first_token_and_every_gap_after_it_as_the_benchmark_times_it() -> None:
    # vLLM 0.32 writes `latencies` beside `ttfts` and `itls`; 0.11 and 0.24 do not.
    captured = _bench("cpu-0.32-step-2rps.json")
    without = {k: v for k, v in captured.items() if k != "latencies"}
    derived = request_latencies(without)
    assert derived is not None and len(derived) == 20
    assert derived == pytest.approx(captured["latencies"], abs=1e-6)


def test_a_step_of_vllm_0_24_whose_json_has_no_latencies_is_judged_as_one_of_0_32() -> None:
    captured = _bench("cpu-0.32-step-2rps.json")
    as_024 = {k: v for k, v in captured.items() if k != "latencies"}  # 0.24's keys
    assert client_view(as_024).backlog_growth == pytest.approx(
        client_view(captured).backlog_growth, abs=1e-6
    )
    assert client_view(as_024).missing_fields == ()


def test_a_step_of_vllm_0_11_without_start_times_names_the_missing_field() -> None:
    as_011 = {k: v for k, v in _bench("cpu-0.32-step-2rps.json").items()}
    for key in ("latencies", "start_times"):  # 0.11's --save-detailed writes neither
        del as_011[key]
    client = client_view(as_011)
    assert client.missing_fields == ("start_times",)
    assert keeps_up(client, 0.9) is None
    assert unjudged_reason(client) == (
        "the benchmark's JSON has no start_times (vllm bench serve --save-detailed of this version)"
    )
    # A step too short to tell says so instead.
    assert unjudged_reason(client_view(_bench("cpu-0.32-step-2rps.json"))) == (
        "its arrivals spanned less than 2× the latency of its first requests"
    )


def _gz(name: str) -> dict[str, Any]:
    with gzip.open(FIXTURES / "bench" / name, "rt") as f:
        return dict(json.load(f))


def _backlog_by_hand(bench: dict[str, Any]) -> float:
    """The slope of (k-th completion − k-th arrival) against the k-th arrival, each latency
    the first token plus every gap: statistics' least squares, not the lab's fit."""
    arrivals = sorted(bench["start_times"])
    ends = sorted(
        t + f + sum(g)
        for t, f, g in zip(bench["start_times"], bench["ttfts"], bench["itls"], strict=True)
    )
    slope, _ = statistics.linear_regression(
        arrivals, [e - a for a, e in zip(arrivals, ends, strict=True)]
    )
    return slope


@pytest.mark.parametrize(
    ("name", "kept", "rate"),
    [
        ("cuda-0.24.0-h200-step-4rps.json.gz", True, 4),
        ("cuda-0.24.0-h200-step-16rps.json.gz", False, 16),
    ],
)
def test_vllm_0_24s_benchmark_on_an_h200_is_judged_from_its_first_tokens_and_gaps(
    name: str, kept: bool, rate: float
) -> None:
    # Captured on one H200 (docs/results/h200-sweep/, sweep A: 512 tokens in and out):
    # vLLM 0.24's JSON has start_times, ttfts and itls, and no latencies.
    bench = _gz(name)
    assert "latencies" not in bench and "start_times" in bench
    client = client_view(bench)
    assert client.missing_fields == ()
    assert client.backlog_growth == pytest.approx(_backlog_by_hand(bench), rel=1e-6)
    assert client.arrival_rate == pytest.approx(rate, rel=0.02)
    assert keeps_up(client, 0.9) is kept


def test_a_step_too_short_to_judge_falls_behind_when_its_backlog_grows_too_fast() -> None:
    # The H200's step at 48 req/s: 960 requests over 20 s whose first ones took 30 s, the
    # backlog growing 3.1 s a second: all of them in the batch at once would only lower it.
    short = replace_client(arrival_rate=48.0, backlog_growth=3.1, span=20.0, early=30.0)
    assert keeps_up(short, 0.9) is False
    # The same shortness with a level backlog cannot tell.
    assert keeps_up(replace_client(48.0, 0.0, 20.0, 30.0), 0.9) is None


def replace_client(arrival_rate: float, backlog_growth: float, span: float, early: float) -> Any:
    base = client_view(_bench("cpu-0.32-step-2rps.json"))
    return dataclasses.replace(
        base,
        arrival_rate=arrival_rate,
        backlog_growth=backlog_growth,
        arrival_span_seconds=span,
        early_latency_seconds=early,
        failed=0,
    )
