"""The rate sweep in report.md: its summary line (the knee, the forecast) and its section
(each step from the client's and the server's side, the knee and its mechanism, the
first preemption)."""

from __future__ import annotations

from typing import NamedTuple

from vllm_glassbox.lab.experiments.pool_acts import SATURATED
from vllm_glassbox.lab.experiments.pool_forecasts import (
    FALSE_ALARM_GRACE_SECONDS,
    forecast_table,
    verdict,
)
from vllm_glassbox.lab.experiments.rate_sweep.judge import (
    LIMITS,
    MIN_SPAN_LATENCIES,
    TPOT_AGREEMENT,
    step_goodput,
    unjudged_reason,
)
from vllm_glassbox.lab.experiments.rate_sweep.result import (
    ClientView,
    RateSweepResult,
    ServerView,
    SweepStep,
)
from vllm_glassbox.lab.experiments.rate_sweep.views import MIN_JUDGED_REQUESTS
from vllm_glassbox.lab.report_format import (
    Column,
    gbs,
    integer,
    num,
    percent,
    plot_name,
    server_facts,
    table,
    table_of,
)
from vllm_glassbox.lab.results import PhaseResult


def summary(r: RateSweepResult) -> str:
    knee = r.knee
    if knee.rate is None and knee.first_unsustained_rate is None:
        head = "no step long enough to judge"
    elif knee.rate is None:
        head = f"not even {knee.first_unsustained_rate:g} req/s kept up with"
    elif knee.first_unsustained_rate is None:
        head = f"kept up with every step judged, up to {knee.rate:g} req/s: the knee is higher"
    else:
        head = f"knee at {knee.rate:g} req/s"
        if knee.unjudged:
            head = (
                f"knee between {knee.rate:g} and {knee.first_unsustained_rate:g} req/s "
                f"({', '.join(f'{r:g}' for r in knee.unjudged)} not judged)"
            )
    if knee.first_unsustained_rate is not None and knee.limit:
        head += f" (at {knee.first_unsustained_rate:g} req/s: {LIMITS[knee.limit]})"
    return f"{head}; first preemption forecast: {verdict(r.forecast)}."


def _ms(value: float | None) -> str:
    return num(value, scale=1000)


class _Client(NamedTuple):
    step: SweepStep
    view: ClientView


CLIENT_COLUMNS: tuple[Column[_Client], ...] = (
    Column("rate req/s", lambda r: f"{r.step.rate:g}"),
    Column("arrived req/s", lambda r: num(r.view.arrival_rate)),
    Column("backlog s/s", lambda r: num(r.view.backlog_growth, 2)),
    Column("achieved req/s", lambda r: num(r.step.achieved_rate)),
    Column("keeps up", lambda r: {True: "yes", False: "**no**", None: "–"}[r.step.keeps_up]),
    Column("done", lambda r: str(r.view.completed)),
    Column("failed", lambda r: str(r.view.failed)),
    Column("goodput req/s", lambda r: num(step_goodput(r.step)[0])),
    Column("within SLOs", lambda r: percent(step_goodput(r.step)[1])),
    Column("TTFT p50/p99 ms", lambda r: f"{_ms(r.view.ttft_p50)} / {_ms(r.view.ttft_p99)}"),
    Column("TPOT p50/p99 ms", lambda r: f"{_ms(r.view.tpot_p50)} / {_ms(r.view.tpot_p99)}"),
    Column("ITL p50/p99 ms", lambda r: f"{_ms(r.view.itl_p50)} / {_ms(r.view.itl_p99)}"),
    Column("E2E p50/p99 s", lambda r: f"{num(r.view.e2el_p50)} / {num(r.view.e2el_p99)}"),
)


class _Server(NamedTuple):
    step: SweepStep
    view: ServerView
    exporter: bool  # the exporter beside gave its headroom series


def _min_headroom(r: _Server) -> str:
    exporter = r.view.min_exporter_headroom_requests
    return integer(r.view.min_headroom_requests) + (
        f" (exporter {integer(exporter)})" if r.exporter else ""
    )


SERVER_COLUMNS: tuple[Column[_Server], ...] = (
    Column("rate req/s", lambda r: f"{r.step.rate:g}"),
    Column("TPOT counters ms", lambda r: _ms(r.view.tpot_seconds)),
    Column("client mean ms", lambda r: _ms(r.step.client.tpot_mean if r.step.client else None)),
    Column("agree", lambda r: _agree_cell(r.step)),
    Column("tokens/engine step", lambda r: num(r.view.tokens_per_engine_step)),
    Column("preemptions/s", lambda r: num(r.view.preemptions_per_second)),
    Column("peak KV", lambda r: percent(r.view.peak_kv_cache_usage)),
    Column("peak waiting", lambda r: integer(r.view.peak_waiting)),
    Column("peak running", lambda r: integer(r.view.peak_running)),
    Column("min headroom", _min_headroom),
    Column("weight reads", lambda r: gbs(r.view.weight_read_bandwidth)),
    Column("host load", lambda r: num(r.step.host_load, 2)),
    Column("acts", lambda r: " → ".join(r.step.acts)),
    Column("limit", lambda r: r.step.limit or ""),
)


def section(phase: PhaseResult, r: RateSweepResult) -> list[str]:
    out = server_facts(r.startup)
    slos = ", ".join(f"{k} ≤ {v * 1000:g} ms" for k, v in r.goodput_slos.items()) or "none"
    if r.slo_file:
        slos = f"the objectives of {r.slo_file} (below)"
    out += [
        f"`vllm bench serve` at each rate: {r.arrivals} arrivals, random prompts of "
        f"{r.input_len} tokens, {r.output_len} generated (EOS ignored)"
        + (f", at most {r.max_concurrency} at once" if r.max_concurrency else "")
        + f"; goodput SLOs: {slos}. Its JSON of each step is kept beside the report.",
        "",
        "**The client's view** (the benchmark). Backlog: how many seconds the time from the "
        "k-th arrival to the k-th completion grows per second of arrivals — level (0) for "
        "a server that keeps up, whatever the arrivals' randomness; achieved: the rate the "
        "requests actually arrived at over 1 + that growth. A step keeps up when it "
        f"serves at least {percent(r.keep_up)} of the arrival rate and every request is "
        f"answered. A step is not judged (–) with fewer than {MIN_JUDGED_REQUESTS} requests, "
        f"or when its arrivals span less than {MIN_SPAN_LATENCIES:g}× the latency of its "
        "first requests: a batching server is still filling up then, every request in it "
        "at once.",
        "",
    ]
    clients = [_Client(st, c) for st in r.steps if (c := st.client) is not None]
    out += table_of(CLIENT_COLUMNS, clients)
    out += _objectives(r)
    out += [
        "**The server's view** (vLLM's counters around each step through the derivation "
        "core; peaks and headroom from the polls of its page"
        + (", the exporter beside it for its headroom series" if r.exporter else "")
        + "). TPOT from counters against the client's mean TPOT; the host's 1-minute load "
        f"average at each step's end ({integer(r.host_cpus)} CPUs):",
        "",
    ]
    servers = [_Server(st, sv, r.exporter) for st in r.steps if (sv := st.server) is not None]
    out += table_of(SERVER_COLUMNS, servers)
    notes = [st for st in r.steps if st.tpot_note]
    for st in notes:
        out += [f"- At {st.rate:g} req/s the two TPOTs differ: {st.tpot_note}."]
    if notes:
        out += [""]
    elif any(st.tpot_agree for st in r.steps):
        out += [f"The two TPOTs agree within {TPOT_AGREEMENT:.0%} at every step.", ""]
    out += ["**The knee.** " + _knee_words(r), "", "**The first preemption.** "]
    words = _forecast_words(r)
    out[-1] += words[0]
    out += [*words[1:], ""]
    if SATURATED in {a for st in r.steps for a in st.acts}:
        rates = [f"{st.rate:g}" for st in r.steps if SATURATED in st.acts]
        out += [f"The act *{SATURATED}* happened at {', '.join(rates)} req/s.", ""]
    for st in r.steps:
        if st.error:
            out += [f"- step at {st.rate:g} req/s: {st.error.splitlines()[0]}"]
    if r.missed_polls:
        out += [f"{r.missed_polls} poll(s) of vLLM's page failed (kept out of the timeline).", ""]
    out += [
        f"![rate sweep]({plot_name(phase, 'sweep')})",
        "",
        f"![rate sweep timeline]({plot_name(phase, 'timeline')})",
        "",
    ]
    return out


def _agree_cell(st: SweepStep) -> str:
    if st.tpot_agree is None:
        return "–"
    return ("yes" if st.tpot_agree else "**no**") + f" ({percent(st.tpot_difference, signed=True)})"


def _knee_words(r: RateSweepResult) -> str:
    k = r.knee
    if k.first_unsustained_rate is None:
        top = max((st.rate for st in r.steps if st.keeps_up), default=None)
        words = (
            f"Every step judged kept up (up to {top:g} req/s): the knee lies higher."
            if top is not None
            else "No step could be judged: "
            + "; ".join(
                dict.fromkeys(
                    f"at {st.rate:g} req/s {reason}"
                    for st in r.steps
                    if st.client and (reason := unjudged_reason(st.client))
                )
            )
            + "."
        )
    else:
        where = (
            f"The server keeps up with {k.rate:g} req/s and falls behind at "
            f"{k.first_unsustained_rate:g} req/s"
            if k.rate is not None
            else f"The server falls behind already at {k.first_unsustained_rate:g} req/s"
        )
        words = f"{where}. What ends it: **{k.limit}** — {k.limit_text}."
        fell = next(st for st in r.steps if st.rate == k.first_unsustained_rate)
        if fell.client and fell.client.failed:
            words += (
                f" {fell.client.failed} request(s) failed there"
                + (f": {fell.client.error}" if fell.client.error else "")
                + "."
            )
        if k.unjudged:
            words += (
                f" The steps between, at {', '.join(f'{r:g}' for r in k.unjudged)} req/s, "
                "could not be judged (arrivals spanning less than twice their first "
                "requests' latency): the knee lies among them."
            )
        step = next(st for st in r.steps if st.rate == k.first_unsustained_rate)
        if step.index > r.steps[0].index and step.decode_slowdown and step.server:
            words += (
                f" There, decode steps took {step.decode_slowdown:.2f}× as long as at the "
                f"lowest rate, {num(step.server.tokens_per_engine_step)} tokens per engine "
                f"step; peak KV usage {percent(step.server.peak_kv_cache_usage)}, peak queue "
                f"{integer(step.server.peak_waiting)}, "
                f"{step.server.preemptions:g} preemptions"
                + (
                    f"; vLLM's API server used {step.server.api_server_cpu:.2f} CPU-seconds "
                    "per second"
                    if step.server.api_server_cpu is not None
                    else ""
                )
                + "."
            )
    if r.goodput_slos or r.slo_file:
        within = (
            f"every objective of {r.slo_file} at its target"
            if r.slo_file
            else f"{percent(r.keep_up)} of requests or more"
        )
        words += (
            f" Within the SLOs ({within}): up to {k.slo_rate:g} req/s."
            if k.slo_rate is not None
            else " Not even the first step kept its requests within the SLOs."
        )
    return words


def _objectives(r: RateSweepResult) -> list[str]:
    """Each step's requests by every objective of the SLO file that applies to the model."""
    if not r.slo_file:
        return []
    out = [
        f"**The objectives of {r.slo_file}**, the definition its rules use (core/slo/): "
        "a latency is within its objective up to the bucket boundary the rules count (the "
        "threshold, or the nearest vLLM boundary below it); failed requests count against "
        "the errors objective only. Goodput above: the requests within every objective.",
        "",
    ]
    rows = [
        [
            f"{st.rate:g}",
            f"{a.objective} ({a.sli})",
            "–" if a.threshold_seconds is None else f"{a.threshold_seconds * 1000:g} ms",
            f"{a.good} / {a.counted}",
            percent(a.share),
            percent(a.target),
            num(a.burn_rate),
            {True: "yes", False: "**no**", None: "–"}[a.met],
        ]
        for st in r.steps
        if st.slo is not None
        for a in st.slo.attainments
    ]
    headers = ["rate req/s", "objective", "within", "good / counted", "attainment", "target"]
    return out + table([*headers, "burn rate", "met"], rows)


def _forecast_words(r: RateSweepResult) -> list[str]:
    f = r.forecast
    if f.first_preemption_at is None:
        return ["No preemption happened in the sweep."]
    step = next((p.step for p in r.timeline if p.t >= f.first_preemption_at), None)
    rate = next((st.rate for st in r.steps if st.index == step), None)
    return [
        f"First counted at t = {f.first_preemption_at:.1f} s (the step at {num(rate)} req/s). "
        f"Did the pool's forecasts see it coming? {verdict(f)}. vLLM counts a preemption "
        "when the preempted request runs again, so the count trails the eviction itself; a "
        f"warning no preemption followed within {FALSE_ALARM_GRACE_SECONDS:g} s of its end "
        "is a false alarm.",
        "",
        *forecast_table(f),
    ]
