"""The rate sweep without a server: its plan, the benchmark's JSON (captured from real runs
of `vllm bench serve` against the vLLM CPU build, tests/fixtures/bench), the knee, its
mechanism, the pool's forecasts, the report; and the API key's path through the lab.
End to end against a real vLLM: tests/e2e/test_lab_sweep.py."""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.core import derive
from vllm_glassbox.core.snapshot import read_snapshot
from vllm_glassbox.lab.backends.backend import Deployed
from vllm_glassbox.lab.cli import main as lab_main
from vllm_glassbox.lab.experiments.pool_forecasts import Forecaster, judge_timeline
from vllm_glassbox.lab.experiments.rate_sweep import (
    ADMISSION,
    CLIENT_LIMIT,
    DECODE_STEPS,
    FAILED,
    FIRST_STEP,
    KV_POOL,
    ClientView,
    Doubling,
    RateSweepPhase,
    RateSweepResult,
    ServerView,
    SweepPoint,
    SweepStep,
    achieved_rate,
    backlog_growth,
    bench_args,
    client_view,
    find_knee,
    judge_steps,
    keeps_up,
    run_bench,
    slo_share,
    tpot_verdict,
)
from vllm_glassbox.lab.experiments.rate_sweep.views import sweep_point
from vllm_glassbox.lab.plan import PlanError, load_plan, packaged_plan, parse_plan
from vllm_glassbox.lab.report import write_outputs
from vllm_glassbox.lab.results import LabResults, PhaseResult
from vllm_glassbox.lab.vllm.credentials import ApiKeySource, open_api_key

from tests.fixtures import FIXTURES

BENCH = FIXTURES / "bench"
PNG = b"\x89PNG"
LOCAL = {"local": {"args": ["--model", "m"]}}


def bench_json(name: str) -> dict[str, Any]:
    return dict(json.loads((BENCH / name).read_text()))


def problems_of(phase: dict[str, Any], **plan: Any) -> list[str]:
    with pytest.raises(PlanError) as e:
        parse_plan({"target": LOCAL, "phases": [phase], **plan})
    return e.value.problems


# --- the plan --------------------------------------------------------------------------------


def test_the_shipped_cpu_sweep_doubles_poisson_rates_until_the_server_falls_behind() -> None:
    plan = load_plan(packaged_plan("cpu-sweep"))  # type: ignore[arg-type]
    (sweep,) = plan.phases
    assert isinstance(sweep, RateSweepPhase)
    assert sweep.rates == Doubling(0.125, 6) and sweep.burstiness == 1.0
    assert sweep.arrivals == "Poisson"
    assert (sweep.input_len, sweep.output_len, sweep.step_seconds) == (32, 200, 40.0)
    assert [sweep.requests_at(r) for r in (0.125, 0.25, 0.5, 1, 2)] == [10, 10, 20, 40, 80]
    assert sweep.goodput == {"ttft": 2.0, "tpot": 0.1}
    assert plan.local is not None and plan.local.exporter
    # The demo stays short: the sweep is a plan of its own.
    demo = load_plan(packaged_plan("cpu-demo"))  # type: ignore[arg-type]
    assert "rate-sweep" not in [p.kind for p in demo.phases]


def test_lab_check_describes_a_sweep(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    phase = {
        "kind": "rate-sweep",
        "rates": [1, 2.5],
        "arrivals": "constant",
        "max_concurrency": 8,
        "goodput": {"ttft": "500ms"},
    }
    path.write_text(yaml.safe_dump({"target": LOCAL, "phases": [phase]}))
    assert lab_main(["check", str(path)], "lab") == 0
    assert (
        "rate-sweep (rate-sweep): vllm bench serve at 1, 2.5 req/s, constant arrivals for "
        "60s a step, 128 tokens in / 256 out, at most 8 at once, goodput ttft ≤ 500 ms"
    ) in capsys.readouterr().out


def test_a_bad_sweep_phase_is_refused_with_every_problem_named() -> None:
    problems = problems_of(
        {
            "kind": "rate-sweep",
            "rates": [2, -1, 1],
            "arrivals": "bursty",
            "goodput": {"ttft": "0s", "latency": "1s"},
            "step_duration": 0,
            "keep_up": 1.5,
            "max_concurrency": 0,
            "bench_command": "",
            "input_len": "many",
        }
    )
    assert problems == [
        "phases[0].rates: [1] must be a number > 0, not -1",
        "phases[0].rates: must rise from step to step, each rate once",
        "phases[0].arrivals: must be poisson, constant or a burstiness > 0 (gamma arrivals), "
        "not 'bursty'",
        "phases[0].input_len: must be a positive whole number, not 'many'",
        "phases[0].step_duration: duration must be positive: 0",
        "phases[0].max_concurrency: must be a positive whole number, not 0",
        "phases[0].goodput.ttft: duration must be positive: '0s'",
        "phases[0].goodput.latency: unknown SLO (known: ttft, tpot, e2el)",
        "phases[0].keep_up: must be a number in (0, 1], not 1.5",
        "phases[0].bench_command: must not be empty",
    ]
    assert problems_of({"kind": "rate-sweep"}) == [
        "phases[0].rates: required: a list of requests per second, or {double_from, max_steps}"
    ]
    assert problems_of({"kind": "rate-sweep", "rates": {"max_steps": 0, "by": 3}}) == [
        "phases[0].rates.double_from: required",
        "phases[0].rates.max_steps: must be a positive whole number, not 0",
        "phases[0].rates.by: unknown key (known here: double_from, max_steps)",
    ]
    assert problems_of({"kind": "rate-sweep", "rates": []}) == [
        "phases[0].rates: needs at least one rate"
    ]


def test_an_api_key_is_named_by_its_file_or_variable_never_given_in_the_plan() -> None:
    phase = {"kind": "rate-sweep", "rates": [1]}
    plan = parse_plan({"target": LOCAL, "phases": [phase], "api_key": {"env": "VLLM_KEY"}})
    assert plan.api_key == ApiKeySource(env="VLLM_KEY")
    assert problems_of(phase, api_key={"key": "s3cret"}) == [
        "api_key.key: unknown key (known here: env, file)",
        "api_key: needs either `env: VARIABLE` or `file: PATH` (the key stays out of the plan)",
    ]
    assert problems_of(phase, api_key={"env": "A", "file": "/k"}) == [
        "api_key: needs either `env: VARIABLE` or `file: PATH` (the key stays out of the plan)"
    ]
    assert problems_of(phase, api_key={"env": "NOT-A-NAME"}) == [
        "api_key.env: must be an environment variable's name, not 'NOT-A-NAME'",
        "api_key: needs either `env: VARIABLE` or `file: PATH` (the key stays out of the plan)",
    ]


def test_a_key_from_the_environment_goes_to_a_private_file_and_never_into_a_repr(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GLASSBOX_TEST_KEY", " sk-test-123 \n")
    key = open_api_key(ApiKeySource(env="GLASSBOX_TEST_KEY"))
    try:
        assert key.value == "sk-test-123"
        assert Path(key.file).read_text() == "sk-test-123"
        assert stat.S_IMODE(os.stat(key.file).st_mode) == 0o600
        assert "sk-test" not in repr(key) and "sk-test" not in str(key)
        assert key.headers() == {"Authorization": "Bearer sk-test-123"}
        assert key.credentials().bearer_token_file == key.file
    finally:
        key.close()
    assert not Path(key.file).exists()

    from_file = tmp_path / "key"
    from_file.write_text("sk-file\n")
    key = open_api_key(ApiKeySource(file=str(from_file)))
    key.close()  # the plan's own file is never removed
    assert key.value == "sk-file" and from_file.exists()

    monkeypatch.delenv("GLASSBOX_TEST_KEY")
    with pytest.raises(ValueError, match="the environment variable GLASSBOX_TEST_KEY is not set"):
        open_api_key(ApiKeySource(env="GLASSBOX_TEST_KEY"))
    from_file.write_text("  \n")
    with pytest.raises(ValueError, match=f"cannot read the file {from_file}: the file is empty"):
        open_api_key(ApiKeySource(file=str(from_file)))


def test_lab_run_refuses_a_plan_whose_key_is_not_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GLASSBOX_ABSENT_KEY", raising=False)
    path = tmp_path / "plan.yaml"
    plan = {
        "target": LOCAL,
        "api_key": {"env": "GLASSBOX_ABSENT_KEY"},
        "phases": [{"kind": "rate-sweep", "rates": [1]}],
    }
    path.write_text(yaml.safe_dump(plan))
    out = tmp_path / "out"
    assert lab_main(["run", str(path), "--out", str(out)], "lab") == 2
    assert "api_key: the environment variable GLASSBOX_ABSENT_KEY is not set or empty" in (
        capsys.readouterr().err
    )
    assert not out.exists()


# --- the benchmark's side ----------------------------------------------------------------------


def test_the_benchmarks_json_is_the_clients_view_in_seconds() -> None:
    c = client_view(bench_json("cpu-0.32-step-2rps.json"))
    assert (c.completed, c.failed) == (20, 0)
    assert c.tpot_mean == pytest.approx(0.07067855818869366)
    assert c.ttft_p50 == pytest.approx(0.7299041500000385)
    assert c.e2el_p99 == pytest.approx(18.832417580749553)
    assert c.arrival_rate == pytest.approx(1.968, abs=0.001)  # 2 asked, Poisson
    assert slo_share(c) == pytest.approx(0.75)  # 15 of 20 within TTFT 2 s, TPOT 200 ms
    # 20 requests arriving over 9.7 s, the first of them taking 18 s: all of them were in
    # the batch at once and finished together at the end. Too short a step to tell.
    assert c.arrival_span_seconds == pytest.approx(9.65, abs=0.01)
    assert c.early_latency_seconds == pytest.approx(18.4, abs=0.1)
    assert keeps_up(c, 0.9) is None
    low = client_view(bench_json("cpu-0.32-step-0.5rps.json"))
    assert low.completed == 5 and low.backlog_growth is None  # fewer than 8 requests
    assert keeps_up(low, 0.9) is None


def test_the_backlog_is_level_when_the_server_keeps_up_and_grows_when_it_falls_behind() -> None:
    arrivals = [float(k) for k in range(40)]  # one request a second for 40 s
    level = backlog_growth(arrivals, [3.0] * 40)
    assert level == pytest.approx(0.0)
    # A server finishing one request every 2 s: the k-th completes at 3 + 2k.
    behind = backlog_growth(arrivals, [3.0 + 2 * k - k for k in range(40)])
    assert behind == pytest.approx(1.0)
    # Arrival order need not be completion order: Poisson-like shuffled latencies.
    shuffled = backlog_growth(arrivals, [3.0 + (k % 3) for k in range(40)])
    assert shuffled is not None and abs(shuffled) < 0.05
    kept = client(
        completed=40,
        arrival_rate=1.0,
        backlog_growth=level,
        arrival_span_seconds=39.0,
        early_latency_seconds=3.0,
    )
    assert achieved_rate(kept) == pytest.approx(1.0) and keeps_up(kept, 0.9) is True
    fell = replace(kept, backlog_growth=behind, early_latency_seconds=3.5)
    assert achieved_rate(fell) == pytest.approx(0.5) and keeps_up(fell, 0.9) is False
    assert keeps_up(replace(kept, failed=1), 0.9) is False  # an unanswered request
    assert keeps_up(replace(kept, early_latency_seconds=25.0), 0.9) is None  # too short


def test_bench_args_carry_the_plan_and_the_key_travels_only_in_the_environment(
    tmp_path: Path,
) -> None:
    phase = load_plan(packaged_plan("cpu-sweep")).phases[0]  # type: ignore[arg-type]
    assert isinstance(phase, RateSweepPhase)
    constant = replace(phase, burstiness=math.inf, max_concurrency=4)
    deployed = Deployed("http://127.0.0.1:9", "", "tiny", model_dir="/models/small")
    args = bench_args(constant, deployed, 0.5, 20, tmp_path, "step.json")
    pairs = dict(itertools.pairwise(args))
    assert pairs["--base-url"] == "http://127.0.0.1:9"
    assert (pairs["--served-model-name"], pairs["--tokenizer"]) == ("tiny", "/models/small")
    assert (pairs["--request-rate"], pairs["--burstiness"], pairs["--num-prompts"]) == (
        "0.5",
        "inf",
        "20",
    )
    assert (pairs["--random-input-len"], pairs["--random-output-len"]) == ("32", "200")
    assert pairs["--max-concurrency"] == "4"
    assert args[args.index("--goodput") + 1 :][:2] == ["ttft:2000", "tpot:100"]
    assert "--save-detailed" in args and pairs["--result-filename"] == "step.json"

    # The launcher's stand-in writes what it was given: the key in its environment only.
    seen = tmp_path / "seen.json"
    probe = (
        "import json, os, sys; json.dump({'argv': sys.argv[1:], "
        f"'key': os.environ.get('OPENAI_API_KEY')}}, open({str(seen)!r}, 'w'))"
    )
    run_bench([sys.executable, "-c", probe], args, tmp_path / "bench.log", 60, "sk-bench")
    got = json.loads(seen.read_text())
    assert got["key"] == "sk-bench" and "sk-bench" not in " ".join(got["argv"])
    with pytest.raises(Exception, match="exited with code 3"):
        run_bench([sys.executable, "-c", "raise SystemExit(3)"], [], tmp_path / "b.log", 60, None)


# --- what the numbers mean --------------------------------------------------------------------


def server(**values: Any) -> ServerView:
    base: dict[str, Any] = {name: None for name in ServerView.__dataclass_fields__}
    return ServerView(**{**base, "preemptions": 0.0, **values})


def client(**values: Any) -> ClientView:
    base: dict[str, Any] = {name: None for name in ClientView.__dataclass_fields__}
    return ClientView(**{**base, "completed": 10, "failed": 0, "duration_seconds": 1.0, **values})


def step(index: int, rate: float, up: bool | None, sv: ServerView, **more: Any) -> SweepStep:
    values: dict[str, Any] = {
        "client": None,
        "achieved_rate": None,
        "tpot_difference": None,
        "tpot_agree": None,
        "tpot_note": None,
        **more,
    }
    return SweepStep(index, rate, 10, None, server=sv, keeps_up=up, **values)


def test_the_knee_is_the_last_rate_kept_up_with_and_the_mechanism_seen_where_it_ends() -> None:
    low = server(inter_token_latency_seconds=0.010, peak_kv_cache_usage=0.2, peak_waiting=0)
    full = server(
        inter_token_latency_seconds=0.030,
        peak_kv_cache_usage=1.0,
        peak_waiting=4,
        preemptions=6.0,
        tokens_per_engine_step=9.4,
    )
    steps = judge_steps(
        [step(0, 0.25, True, low), step(1, 0.5, True, low), step(2, 1.0, False, full)], 0.95, None
    )
    assert [s.limit for s in steps] == [None, None, KV_POOL]
    assert steps[2].decode_slowdown == pytest.approx(3.0)
    knee = find_knee(steps, 0.9)
    assert (knee.rate, knee.first_unsustained_rate, knee.limit) == (0.5, 1.0, KV_POOL)
    assert knee.limit_text == "the KV pool full, then requests queue and vLLM preempts"

    def limit(sv: ServerView, **more: Any) -> str | None:
        judged = judge_steps([step(0, 1, True, low), step(1, 2, False, sv, **more)], 0.95, 8)
        return judged[1].limit

    # Preemptions between two polls: no poll saw the pool full, vLLM's counter says it was.
    missed = server(inter_token_latency_seconds=0.02, peak_kv_cache_usage=0.6, preemptions=2.0)
    assert limit(missed) == KV_POOL
    slower = server(inter_token_latency_seconds=0.013, peak_kv_cache_usage=0.5, peak_waiting=0)
    assert limit(slower) == DECODE_STEPS  # 1.3× longer steps, pool half full, no queue
    queued = server(inter_token_latency_seconds=0.011, peak_kv_cache_usage=0.5, peak_waiting=3)
    assert limit(queued) == ADMISSION
    capped = client(max_concurrent_requests=8.0)
    assert limit(slower, client=capped) == CLIENT_LIMIT
    # The lowest rate already falls behind with room in the pool: nothing to compare
    # with (a shared machine's other work, or a sweep that starts too high).
    (alone,) = judge_steps([step(0, 0.25, False, low)], 0.95, None)
    assert alone.limit == FIRST_STEP and find_knee([alone], 0.9).rate is None
    # Steps that could not be judged between the last kept and the first fallen behind:
    # the knee lies among them, and the report says so.
    between = find_knee(
        [step(0, 0.25, True, low), step(1, 0.5, None, low), step(2, 1.0, False, full)], 0.9
    )
    assert (between.rate, between.unjudged, between.first_unsustained_rate) == (0.25, (0.5,), 1.0)
    # Not judged (too short a step): no knee claimed, the sweep goes on.
    assert find_knee([step(0, 1, None, low)], 0.9).rate is None


def test_a_step_that_kept_up_but_for_failed_requests_says_so_and_names_the_error() -> None:
    # The CPU sweep at 2 req/s: 79 of 80 requests served as they came (backlog 0.032 s/s),
    # one dropped by the client's connection ("Server disconnected").
    served = client(
        completed=79,
        failed=1,
        arrival_rate=1.97,
        backlog_growth=0.032,
        arrival_span_seconds=40.0,
        early_latency_seconds=2.0,
        error="aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected",
    )
    assert keeps_up(served, 0.9) is False  # every request must be answered
    low = server(inter_token_latency_seconds=0.0109, peak_kv_cache_usage=0.06, peak_waiting=0)
    busier = server(inter_token_latency_seconds=0.0136, peak_kv_cache_usage=0.77, peak_waiting=0)
    judged = judge_steps(
        [step(0, 1, True, low), step(1, 2, False, busier, client=served)], 0.95, None
    )
    assert judged[1].limit == FAILED
    assert find_knee(judged, 0.9).limit == FAILED


def point(
    t: float, step_: int, headroom: float | None, preempted: float, **more: Any
) -> SweepPoint:
    return SweepPoint(step_, t, t, 5, 0, 0.5, preempted, 0, headroom, None, **more)


def test_the_headroom_of_two_engines_is_each_engines_pool_added_up() -> None:
    # Two data-parallel engines of 16,384-token pools. By hand: engine 0 holds 8,192
    # tokens for 4 requests (2,048 each), 8,192 free: 4 more; engine 1 holds 4,096 for
    # 1 request, 12,288 free: 3 more. The exporter publishes each engine's and the lab
    # reads their sum: 7 requests, 20,480 tokens (the fullest engine's usage over every
    # engine's requests made 5 and 8,192).
    page = read_snapshot(
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 4\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25\n'
    )
    forecast = Forecaster(page, 16384).at(0.0, page, 1.0)
    p = sweep_point(0, 1.0, 1.0, page, page, 16384, forecast)
    assert (p.headroom_requests, p.free_tokens) == (7.0, 20480.0)
    assert (p.running, p.kv_cache_usage) == (5.0, 0.5)  # all requests; the fullest pool


def _judged(points: list[SweepPoint]) -> Any:
    return judge_timeline([replace(p.timeline_point(), t=p.t) for p in points], exporter=True)


def test_the_headroom_forecast_is_how_long_before_the_first_preemption_it_reached_zero() -> None:
    # As the CPU run went: the pool filled (headroom 0), the eviction freed one request's
    # room (1), and vLLM counted the preemption when the request ran again. The exporter,
    # polling every 2 s, saw the full pool one poll later.
    points = [
        point(80.7, 1, 12, 0, exporter_headroom_requests=12),
        point(86.5, 1, 6, 0, exporter_headroom_requests=6),
        point(88.5, 1, 0, 0, exporter_headroom_requests=6),
        point(89.4, 1, 1, 0, exporter_headroom_requests=0),
        point(90.5, 1, 1, 2, exporter_headroom_requests=0),
    ]
    f = _judged(points)
    lab, exporter = f.check("headroom", "lab"), f.check("headroom", "exporter")
    assert f.first_preemption_at == 90.5
    # The lab's 0 at 88.5 s ended a poll before the preemption was counted (it is a
    # poll late): it warned of it, 2.0 s ahead.
    assert (lab.warned_at, lab.lead_seconds, lab.false_alarms) == (88.5, pytest.approx(2.0), 0)
    assert (exporter.warned_at, exporter.lead_seconds) == (89.4, pytest.approx(1.1))
    # A zero in an earlier step, over before the next began, is a false alarm.
    earlier = [point(10, 0, 0, 0), point(20, 1, 3, 0), point(100, 1, 2, 1)]
    check = _judged(earlier).check("headroom")
    assert (check.lead_seconds, check.warnings, check.false_alarms) == (None, 1, 1)
    assert _judged(earlier[:2]).first_preemption_at is None


def test_the_two_tpots_agree_or_the_report_says_why_not() -> None:
    c = client_view(bench_json("cpu-0.32-step-2rps.json"))
    assert tpot_verdict(c, server(tpot_seconds=0.0707)) == (
        pytest.approx(-0.0003, abs=1e-3),
        True,
        None,
    )
    diff, agree, why = tpot_verdict(c, server(tpot_seconds=0.05))
    assert agree is False and diff == pytest.approx(0.4136, abs=1e-3)
    assert why is not None and "over HTTP" in why
    _, _, why = tpot_verdict(replace(c, failed=2), server(tpot_seconds=0.05))
    assert why is not None and why.startswith("2 request(s) failed")


def test_a_client_tpot_above_the_counters_is_shown_beside_what_the_step_measured() -> None:
    # The H200 sweep at 24 req/s: the client's TPOT twice the counters'. The note states the
    # step's numbers (the API server's CPU from its page, the counters' decode step, the
    # preemptions and the queue), and a busy event loop only where its CPU shows it.
    c = client_view(bench_json("cpu-0.32-step-2rps.json"))
    busy = server(
        tpot_seconds=0.0107,
        inter_token_latency_seconds=0.0107,
        preemptions=223.0,
        peak_waiting=135,
        api_server_cpu=0.97,
    )
    _, agree, why = tpot_verdict(c, busy)
    assert agree is False and why is not None
    assert why.endswith(
        "in this step vLLM's API server used 0.97 CPU-seconds per second — one event loop "
        "busy all along: tokens wait in it, decode steps took 10.7 ms, 223 preemption(s), "
        "up to 135 request(s) waited"
    )
    _, _, quiet = tpot_verdict(c, replace(busy, api_server_cpu=0.31, peak_waiting=0))
    assert quiet is not None and "0.31 CPU-seconds per second, decode steps" in quiet
    _, _, unseen = tpot_verdict(c, replace(busy, api_server_cpu=None))
    assert unseen is not None and "the API server's CPU is not on the page" in unseen
    # CPU seconds per second of wall time, from two readings of one process.
    assert derive.cpu_seconds_per_second(10.0, 19.0, 10.0) == 0.9
    assert derive.cpu_seconds_per_second(10.0, 2.0, 10.0) is None  # another process
    assert derive.cpu_seconds_per_second(None, 2.0, 10.0) is None


# --- the report -----------------------------------------------------------------------------


def test_the_report_shows_each_step_side_by_side_the_knee_and_the_forecast(tmp_path: Path) -> None:
    slow = client_view(bench_json("cpu-0.32-step-0.5rps.json"))
    fast = client_view(bench_json("cpu-0.32-step-2rps.json"))
    low = server(
        tpot_seconds=0.01463,
        inter_token_latency_seconds=0.01463,
        tokens_per_engine_step=1.24,
        peak_kv_cache_usage=0.13,
        peak_waiting=0,
        peak_running=2,
        min_headroom_requests=13,
        weight_read_bandwidth=3.81e9,
    )
    high = server(
        tpot_seconds=0.0707,
        inter_token_latency_seconds=0.0707,
        tokens_per_engine_step=9.41,
        preemptions=6.0,
        preemptions_per_second=0.273,
        peak_kv_cache_usage=1.0,
        peak_waiting=4,
        peak_running=20,
        min_headroom_requests=0,
        weight_read_bandwidth=0.79e9,
    )
    steps = [
        step(0, 0.5, True, low, client=slow, tpot_agree=True, tpot_difference=0.001),
        step(1, 2.0, False, high, client=fast, tpot_agree=True, tpot_difference=-0.001),
    ]
    judged = tuple(judge_steps(steps, 0.95, None))
    points = (point(88.5, 1, 0, 0), point(90.5, 1, 1, 2))
    result = RateSweepResult(
        None, "Poisson", 1.0, 32, 200, None, {"ttft": 2.0}, 0.9, judged, points,
        find_knee(judged, 0.9), _judged(list(points)),
    )  # fmt: skip
    results = LabResults("sweep", "local", 0.0, 1.0, "ok")
    results.phases.append(PhaseResult("sweep", "rate-sweep", "ok", 0.0, 1.0, result))
    write_outputs(results, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "knee at 0.5 req/s (at 2 req/s: the KV pool full, then requests queue" in report
    assert "| 2 | 70.7 | 70.7 | yes (-0.1%) | 9.41 | 0.273 | 100% | 4 | 20 | 0 |" in report
    assert "There, decode steps took 4.83× as long as at the lowest rate" in report
    assert "Within the SLOs (90% of requests or more): up to 0.5 req/s." in report
    assert "yes: the lab's headroom warned 2.0 s before the first preemption" in report
    row = "| headroom | no more request of the current mean size fits (headroom ≤ 0) "
    assert row + "| lab (derivation core) | 2.0 s ahead | 1 | 0 | 2 |" in report
    assert "The act *saturated with a queue*" not in report  # no act named in these steps
    for plot in ("sweep-sweep", "sweep-timeline"):
        assert (tmp_path / "plots" / f"{plot}.png").read_bytes().startswith(PNG)
    data = json.loads((tmp_path / "results.json").read_text())
    (phase,) = data["phases"]
    assert phase["kind"] == "rate-sweep" and phase["knee"]["rate"] == 0.5
    assert phase["steps"][1]["client"]["tpot_mean"] == pytest.approx(0.0707, abs=1e-4)
    assert phase["steps"][1]["server"]["preemptions_per_second"] == 0.273
    lab_headroom = phase["forecast"]["checks"][0]
    assert (lab_headroom["forecast"], lab_headroom["source"]) == ("headroom", "lab")
    assert lab_headroom["lead_seconds"] == pytest.approx(2.0)


# --- the key in front of vLLM's page ------------------------------------------------------------


@pytest.mark.slow  # a poller process and the exporter beside a loopback server
def test_every_reader_of_the_page_presents_the_key_to_a_token_checking_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM leaves /metrics open; a proxy in front may not. The lab's client, its poller
    process and the exporter beside the server all present the key (a loopback server
    that answers 401 without it)."""
    from vllm_glassbox.lab.backends.server_process import free_port
    from vllm_glassbox.lab.sidecar import ExporterBeside
    from vllm_glassbox.lab.telemetry import Segment
    from vllm_glassbox.lab.vllm.client import LabError, Sampler, VllmClient

    from tests.misbehaving import FakeVllm, Misbehaving, guarded, healthy

    monkeypatch.setenv("GLASSBOX_PROXY_KEY", "sk-proxy")
    key = open_api_key(ApiKeySource(env="GLASSBOX_PROXY_KEY"))
    with Misbehaving(FakeVllm()) as proxy:
        proxy.behave(guarded(healthy(proxy.fake), lambda: "sk-proxy"))
        with pytest.raises(LabError, match="401"):
            VllmClient(proxy.url, "fake").snapshot()
        client = VllmClient(proxy.url, "fake", api_key=key)
        assert list(client.snapshot().engines)
        pages: list[object] = []
        missed: list[str] = []
        with Sampler(
            client, 0.2, lambda t, snap, *_: pages.append(snap), lambda t, e: missed.append(e)
        ):
            deadline = time.monotonic() + 60
            while len(pages) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
        assert len(pages) >= 2 and not missed
        beside = ExporterBeside(free_port(), bearer_token_file=key.file)
        try:
            beside.server_ready(Segment("p", "rate-sweep", "", 0.0), Deployed(proxy.url, "", "f"))
            assert beside.read()["glassbox_target_up"] == 1.0
        finally:
            beside.close()
            client.close()
    key.close()
