"""The KV-pressure experiment: many long requests at once against one server's KV pool.

The flood is sent all at once; a sampler polls vLLM's page every `poll` seconds for the
pool's usage, the queue and preemptions. The timeline is cut into the article's acts —
the pool fills, requests queue at a full pool, vLLM preempts — each named only where its
condition holds; the largest jump of preemptions in one poll and the gaps between polls
are reported.

The phase's YAML, its run, its result (results.json: `kv_cache_blocks`,
`kv_cache_tokens`, `timeline[]`, `max_preemption_jump`), its section of report.md and
its plot.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable, Sequence, Set
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.derive import counter_increase
from vllm_glassbox.exporter.snapshot import Snapshot
from vllm_glassbox.lab.backend import FlagOverrides
from vllm_glassbox.lab.experiments.base import Experiment, PhaseFailed, describe_error
from vllm_glassbox.lab.measure import Sampler, gauge_max, gauge_total, increase
from vllm_glassbox.lab.plan_yaml import (
    Node,
    Request,
    count,
    duration,
    fraction,
    positive_int,
    read_flags,
    read_request,
    text,
)
from vllm_glassbox.lab.progress import number_text
from vllm_glassbox.lab.report_format import (
    integer,
    num,
    percent,
    plot_name,
    png,
    pyplot,
    server_facts,
    table,
)
from vllm_glassbox.lab.results import JSON, PhaseResult, Startup, startup_json

if TYPE_CHECKING:
    from vllm_glassbox.lab.runner import Lab

KIND = "kv-pressure"
#: The article's run (SPEC §1).
KV_PRESSURE_PROMPT = "Write an extremely long and detailed essay, number {i}."
MAX_TIMELINE_ROWS = 40

# --- the phase ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvPressurePhase:
    name: str
    model: str | None
    flags: FlagOverrides
    request: Request  # prompt may contain {i}, the request's index
    concurrency: int
    poll_seconds: float
    timeout_seconds: float
    saturation: float  # KV usage from which the pool counts as full
    warmup: int  # short requests before the flood, so one-time costs do not delay it
    kind: str = KIND

    @property
    def server_starts(self) -> int:
        return 1

    def models(self) -> list[tuple[str, str]]:
        return [("model", self.model)] if self.model is not None else []

    def without_models(self, models: Set[str]) -> tuple[KvPressurePhase, list[str]]:
        return self, []  # one server, no variants to leave out

    def describe(self) -> str:
        return (
            f"{self.concurrency} requests of {self.request.max_tokens} tokens at once, "
            f"polled every {self.poll_seconds:g}s"
        )


def parse(node: Node, name: str) -> KvPressurePhase:
    """The phase from its YAML, the article's run as defaults."""
    request = read_request(node, KV_PRESSURE_PROMPT, 4096, 0.7)
    try:
        request.prompt.format(i=0)
    except (KeyError, IndexError, ValueError) as e:
        node.problem("prompt", f"only {{i}} may be formatted into it ({e!r})")
    return KvPressurePhase(
        name=name,
        model=node.get("model", text, None),
        flags=read_flags(node, "flags", {"--gpu-memory-utilization": "0.20"}),
        request=request,
        concurrency=node.get("concurrency", positive_int, 32),
        poll_seconds=node.get("poll", duration, 5.0),
        timeout_seconds=node.get("timeout", duration, 3600.0),
        saturation=node.get("saturation", fraction, 0.95),
        warmup=node.get("warmup", count, 1),
    )


# --- what it found -------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelinePoint:
    t: float  # seconds since the flood started, when the poll's page arrived
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # 0–1
    preemptions: float  # since the flood started
    generated_tokens: float  # since the flood started
    latency_seconds: float | None = None  # how long vLLM took to answer the poll
    delay_seconds: float | None = None  # how late after its tick the poll was sent


@dataclass(frozen=True)
class MissedPoll:
    """A poll that failed or timed out: recorded, never silently skipped."""

    t: float
    error: str


@dataclass(frozen=True)
class Act:
    name: str  # see ACT_CONDITIONS
    start_t: float
    end_t: float
    polls: int
    preemptions: float
    peak_waiting: float
    peak_kv_cache_usage: float


@dataclass(frozen=True)
class KvPressureResult:
    startup: Startup | None
    requests: int
    completed: int
    failed: int
    flood_seconds: float  # from the first request sent to the last answered
    timeline: tuple[TimelinePoint, ...]
    acts: tuple[Act, ...]
    max_preemption_jump: float
    max_preemption_jump_at: float | None
    preemptions_total: float
    peak_waiting: float | None
    peak_kv_cache_usage: float | None
    first_full_at: float | None
    first_waiting_at: float | None
    first_preemption_at: float | None
    request_errors: tuple[str, ...] = ()
    poll_seconds: float | None = None  # the period the timeline was polled at
    missed_polls: tuple[MissedPoll, ...] = ()
    late_polls: int = 0  # polls that took longer than one period
    max_gap_seconds: float | None = None  # largest time between two polls' pages
    max_gap_ended_at: float | None = None  # t of the page that ended it
    missing_acts: tuple[str, ...] = ()  # of the article's three, which did not happen

    def to_json(self) -> JSON:
        body = asdict(self)
        body.pop("startup")
        return {
            **startup_json(self.startup),
            **body,
            "timeline": [asdict(p) for p in self.timeline],
            "acts": [asdict(a) for a in self.acts],
            "request_errors": list(self.request_errors),
            "missed_polls": [asdict(m) for m in self.missed_polls],
            "missing_acts": list(self.missing_acts),
        }


# --- its arithmetic (derive's numbers) -----------------------------------------------------


def timeline_point(
    t: float,
    baseline: Snapshot,
    now: Snapshot,
    latency: float | None = None,
    delay: float | None = None,
) -> TimelinePoint:
    grown = increase(baseline, now, t)
    return TimelinePoint(
        t=t,
        running=gauge_total(now, s.RUNNING),
        waiting=gauge_total(now, s.WAITING),
        kv_cache_usage=gauge_max(now, s.KV_USAGE),
        preemptions=grown[s.PREEMPTIONS],
        generated_tokens=grown[s.GENERATION_TOKENS],
        latency_seconds=latency,
        delay_seconds=delay,
    )


# --- what the numbers mean: the acts -------------------------------------------------------

FILLING = "filling"
QUEUE_BEFORE_FULL = "queue before the pool is full"
SATURATED = "saturated with a queue"
FULL_NOBODY_WAITING = "full, nobody waiting"
STORM = "preemption storm"
DRAINING = "draining"
NEVER_FULL = "pool never full"


#: Each act's condition, as the report states it.
ACT_CONDITIONS = {
    FILLING: "nobody waits; the pool grows (it may reach full)",
    QUEUE_BEFORE_FULL: "requests wait although the pool has not been full yet (an "
    "admission backlog, not the pool)",
    SATURATED: "requests wait, and the pool is full or has been (their KV does not fit)",
    FULL_NOBODY_WAITING: "the queue emptied while the pool stays full, before any preemption",
    STORM: "from the first poll that counted preemptions to the last",
    DRAINING: "no more preemptions or queue: the running requests finish",
    NEVER_FULL: "the pool never filled and nobody waited",
}


#: The article's three acts, in order.
THREE_ACTS = (FILLING, SATURATED, STORM)


def preemption_jumps(timeline: Sequence[TimelinePoint]) -> list[float]:
    """Preemptions seen by each poll (the first poll: since the flood started)."""
    previous = 0.0
    jumps = []
    for p in timeline:
        jumps.append(counter_increase(previous, p.preemptions))
        previous = p.preemptions
    return jumps


def act_names(timeline: Sequence[TimelinePoint], saturation: float) -> list[str]:
    """The act of each poll, named only where its condition holds (ACT_CONDITIONS).

    vLLM counts a preemption when the preempted request runs again, so requests queue at
    a full pool before the count moves: the storm follows the queue.
    """
    jumps = preemption_jumps(timeline)
    waiting = [(p.waiting or 0) > 0 for p in timeline]
    full = [(p.kv_cache_usage or 0.0) >= saturation for p in timeline]
    preempted = [i for i, j in enumerate(jumps) if j > 0]
    if not preempted and not any(waiting) and not any(full):
        return [NEVER_FULL] * len(timeline)
    storm = (preempted[0], preempted[-1]) if preempted else None
    names = []
    ever_full = False
    for i in range(len(timeline)):
        ever_full = ever_full or full[i]
        if storm and storm[0] <= i <= storm[1]:
            names.append(STORM)
        elif storm and i > storm[1]:
            names.append(DRAINING)
        elif waiting[i]:
            names.append(SATURATED if ever_full else QUEUE_BEFORE_FULL)
        elif any(waiting[:i]):
            queue_again = any(waiting[i + 1 :]) or storm is not None
            names.append(
                DRAINING if not queue_again else FULL_NOBODY_WAITING if ever_full else FILLING
            )
        else:
            names.append(FILLING)
    return names


def name_acts(timeline: Sequence[TimelinePoint], saturation: float) -> list[Act]:
    """The timeline cut into its acts, each with its preemptions and peaks."""
    acts: list[Act] = []
    names = act_names(timeline, saturation)
    for point, jump, name in zip(timeline, preemption_jumps(timeline), names, strict=True):
        waiting, usage = point.waiting or 0.0, point.kv_cache_usage or 0.0
        if acts and acts[-1].name == name:
            last = acts[-1]
            acts[-1] = Act(
                name,
                last.start_t,
                point.t,
                last.polls + 1,
                last.preemptions + jump,
                max(last.peak_waiting, waiting),
                max(last.peak_kv_cache_usage, usage),
            )
        else:
            acts.append(Act(name, point.t, point.t, 1, jump, waiting, usage))
    return acts


def missing_acts(acts: Sequence[Act]) -> list[str]:
    """Which of the article's three acts did not happen, in their order. The first act
    counts only when it opens the flood (before anything waited)."""
    names = [a.name for a in acts]
    missing = []
    if not names or names[0] != FILLING:
        missing.append(FILLING)
    missing += [act for act in THREE_ACTS[1:] if act not in names]
    return missing


def largest_gap(timeline: Sequence[TimelinePoint]) -> tuple[float | None, float | None]:
    """The longest time between two consecutive polls' pages, and when the page that
    ended it came."""
    gaps = [(b.t - a.t, b.t) for a, b in itertools.pairwise(timeline)]
    gap, at = max(gaps, default=(None, None))
    return gap, at


def first_time(
    timeline: Sequence[TimelinePoint], cond: Callable[[TimelinePoint], bool]
) -> float | None:
    return next((p.t for p in timeline if cond(p)), None)


def _max(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def pressure_summary(timeline: Sequence[TimelinePoint], saturation: float) -> dict[str, object]:
    jumps = preemption_jumps(timeline)
    biggest = max(jumps, default=0.0)
    acts = tuple(name_acts(timeline, saturation))
    return {
        "acts": acts,
        "missing_acts": tuple(missing_acts(acts)),
        "max_preemption_jump": biggest,
        "max_preemption_jump_at": timeline[jumps.index(biggest)].t if biggest > 0 else None,
        "preemptions_total": timeline[-1].preemptions if timeline else 0.0,
        "peak_waiting": _max([p.waiting for p in timeline]),
        "peak_kv_cache_usage": _max([p.kv_cache_usage for p in timeline]),
        "first_full_at": first_time(timeline, lambda p: (p.kv_cache_usage or 0) >= saturation),
        "first_waiting_at": first_time(timeline, lambda p: (p.waiting or 0) > 0),
        "first_preemption_at": first_time(timeline, lambda p: p.preemptions > 0),
        "max_gap_seconds": largest_gap(timeline)[0],
        "max_gap_ended_at": largest_gap(timeline)[1],
    }


# --- the run -------------------------------------------------------------------------------


def run(lab: Lab, phase: KvPressurePhase) -> KvPressureResult:
    """The flood on one server, polled from the empty pool to the last answer."""
    overrides = {**phase.flags, **({"--model": phase.model} if phase.model else {})}
    with lab.segment(phase, "", overrides) as served:
        client = served.client
        model = served.deployed.served_model_name
        bodies = [phase.request.body(model, i=i) for i in range(phase.concurrency)]
        # A short request first: one-time costs of the first request (in vLLM's API
        # server and its kernels) must not hold back the flood's admission.
        warm = {**bodies[0], "max_tokens": min(16, phase.request.max_tokens)}
        lab.warm_up(served, warm, phase.warmup)
        total = float(phase.request.max_tokens * phase.concurrency)
        baseline = client.snapshot()
        timeline: list[TimelinePoint] = []
        missed: list[MissedPoll] = []

        def on_sample(t: float, snap: Snapshot, latency: float, delay: float) -> None:
            point = timeline_point(t, baseline, snap, latency, delay)
            timeline.append(point)
            lab.progress.tokens(point.generated_tokens, total)
            lab.progress.status(_pressure_line(point))

        def on_missed(t: float, error: str) -> None:
            missed.append(MissedPoll(t, error))
            lab.progress.note(f"  poll at {t:.1f}s failed: {error}")

        lab.progress.status(f"flood of {phase.concurrency} requests")
        pool = concurrent.futures.ThreadPoolExecutor(phase.concurrency, "flood")
        started = time.monotonic()
        try:
            # The sampler's first poll is the empty pool at t = 0; the flood follows.
            with Sampler(client, phase.poll_seconds, on_sample, on_missed=on_missed):
                futures = [pool.submit(client.complete, b) for b in bodies]
                done, pending = concurrent.futures.wait(futures, phase.timeout_seconds)
        finally:
            # Never wait for requests in flight: restore() stops the server under them.
            pool.shutdown(wait=False, cancel_futures=True)
        completions = [f.result() for f in done if f.exception() is None]
        errors = [describe_error(e) for f in done if (e := f.exception()) is not None]
        final = client.settled_snapshot(
            baseline, sum(c.completion_tokens for c in completions), len(completions)
        )
        timeline.append(timeline_point(time.monotonic() - started, baseline, final))
        found = pressure_summary(timeline, phase.saturation)
        result = KvPressureResult(
            startup=served.startup,
            requests=phase.concurrency,
            completed=len(completions),
            failed=len(errors) + len(pending),
            flood_seconds=time.monotonic() - started,
            timeline=tuple(timeline),
            request_errors=tuple(sorted(set(errors)))[:10],
            poll_seconds=phase.poll_seconds,
            missed_polls=tuple(missed),
            late_polls=sum(
                1
                for p in timeline
                if p.latency_seconds is not None and p.latency_seconds > phase.poll_seconds
            ),
            **found,  # type: ignore[arg-type]
        )
        lab.progress.note(
            f"  flood: {result.completed}/{result.requests} done, "
            f"{result.preemptions_total:g} preemptions, "
            f"largest jump {result.max_preemption_jump:g} in one poll, "
            f"acts: {' → '.join(a.name for a in result.acts)}"
        )
        if pending:
            raise PhaseFailed(
                f"{len(pending)} request(s) still running after "
                f"{phase.timeout_seconds:g}s (timeout)",
                result,
            )
        if errors:
            raise PhaseFailed(f"{len(errors)} request(s) failed: {errors[0]}", result)
        return result


def _pressure_line(p: TimelinePoint) -> str:
    usage = "–" if p.kv_cache_usage is None else f"{p.kv_cache_usage:.0%}"
    return (
        f"running {number_text(p.running)}, waiting {number_text(p.waiting)}, KV {usage}, "
        f"preemptions {p.preemptions:g}"
    )


# --- the report ----------------------------------------------------------------------------


def summary(k: KvPressureResult) -> str:
    """The pool, its acts, the queue and the preemptions, in one sentence."""
    pool = integer(k.startup.kv_cache_tokens if k.startup else None)
    acts = " → ".join(a.name for a in k.acts)
    story = (
        "the article's three acts"
        if not k.missing_acts
        else f"missing act(s): {', '.join(k.missing_acts)}"
    )
    gap = (
        f"; largest gap between polls {k.max_gap_seconds:.1f} s "
        f"(poll every {num(k.poll_seconds)} s)"
        if k.max_gap_seconds is not None
        else ""
    )
    return (
        f"pool of {pool} tokens; {acts} ({story}); full after {num(k.first_full_at)} s, "
        f"queue peaked at {integer(k.peak_waiting)}, {k.preemptions_total:g} preemptions, the "
        f"largest jump {k.max_preemption_jump:g} in one poll"
        + (
            f" (t = {k.max_preemption_jump_at:.0f} s)"
            if k.max_preemption_jump_at is not None
            else ""
        )
        + gap
        + (f"; {len(k.missed_polls)} poll(s) failed" if k.missed_polls else "")
        + "."
    )


def _sampled(timeline: Sequence[TimelinePoint], keep: set[int]) -> list[int]:
    if len(timeline) <= MAX_TIMELINE_ROWS:
        return list(range(len(timeline)))
    step = len(timeline) / MAX_TIMELINE_ROWS
    picked = {int(i * step) for i in range(MAX_TIMELINE_ROWS)} | keep | {len(timeline) - 1}
    return sorted(picked)


def section(phase: PhaseResult, k: KvPressureResult) -> list[str]:
    out = server_facts(k.startup)
    out += [
        f"{k.requests} concurrent requests, {k.completed} completed, {k.failed} failed, "
        f"in {k.flood_seconds:.0f} s. Preemptions: {k.preemptions_total:g} in total, "
        f"the largest jump **{k.max_preemption_jump:g}** in one poll. Peak KV usage "
        f"{percent(k.peak_kv_cache_usage)}, peak queue {integer(k.peak_waiting)}.",
        "",
        "The acts, each named only where its condition holds. vLLM counts a preemption "
        "when the preempted request runs again, so at a full pool requests queue before "
        "the count moves.",
        "",
    ]
    out += table(
        ["act", "condition", "from s", "to s", "polls", "preemptions", "peak waiting", "peak KV"],
        [
            [
                a.name,
                ACT_CONDITIONS.get(a.name, ""),
                f"{a.start_t:.0f}",
                f"{a.end_t:.0f}",
                str(a.polls),
                f"{a.preemptions:g}",
                integer(a.peak_waiting),
                percent(a.peak_kv_cache_usage),
            ]
            for a in k.acts
        ],
    )
    if k.missing_acts:
        out += [
            f"**Missing act(s)** of the article's three ({' → '.join(THREE_ACTS)}): "
            f"{', '.join(k.missing_acts)}.",
            "",
        ]
    else:
        out += ["All three of the article's acts happened, in order.", ""]
    if k.poll_seconds is not None:
        hole = k.max_gap_seconds is not None and k.max_gap_seconds > 2 * k.poll_seconds
        out += [
            f"Polled every {num(k.poll_seconds)} s by a process of its own: "
            f"{len(k.timeline)} pages, {k.late_polls} late (vLLM took longer than a period "
            f"to answer), {len(k.missed_polls)} failed; the largest gap between two pages "
            f"{num(k.max_gap_seconds)} s"
            + (" — **a hole in the timeline** (more than two periods)" if hole else "")
            + _gap_cause(k)
            + ".",
            "",
        ]
        for m in k.missed_polls[:10]:
            out += [f"- poll at {m.t:.1f} s failed: {m.error}"]
        if k.missed_polls:
            out += [""]
    jumps = preemption_jumps(k.timeline)
    biggest = {jumps.index(max(jumps))} if jumps and max(jumps) > 0 else set()
    rows = [
        [
            f"{k.timeline[i].t:.1f}",
            num(k.timeline[i].running),
            num(k.timeline[i].waiting),
            percent(k.timeline[i].kv_cache_usage),
            f"{k.timeline[i].preemptions:g}",
            f"+{jumps[i]:g}" if jumps[i] else "",
            integer(k.timeline[i].generated_tokens),
            num(k.timeline[i].latency_seconds, 2),
            num(k.timeline[i].delay_seconds, 2),
        ]
        for i in _sampled(k.timeline, biggest)
    ]
    out += [
        "The pool timeline"
        + (
            " (sampled; every poll is in results.json)"
            if len(k.timeline) > MAX_TIMELINE_ROWS
            else ""
        )
        + ":",
        "",
    ]
    out += table(
        [
            "t s",
            "running",
            "waiting",
            "KV usage",
            "preemptions",
            "this poll",
            "tokens",
            "answer s",
            "sent late s",
        ],
        rows,
    )
    if k.request_errors:
        out += ["Request errors: " + "; ".join(k.request_errors), ""]
    out += [f"![KV pressure timeline]({plot_name(phase, 'timeline')})", ""]
    return out


def _gap_cause(k: KvPressureResult) -> str:
    """Why the largest gap: the page ending it was sent late, or vLLM answered late."""
    end = next((p for p in k.timeline if p.t == k.max_gap_ended_at), None)
    if end is None or k.poll_seconds is None or end.latency_seconds is None:
        return ""
    parts = []
    if (end.delay_seconds or 0.0) > 0.5 * k.poll_seconds:
        parts.append(
            f"its closing poll was sent {end.delay_seconds:.1f} s after its tick (this "
            "machine's CPU was taken)"
        )
    if end.latency_seconds > 0.5 * k.poll_seconds:
        parts.append(f"vLLM took {end.latency_seconds:.1f} s to answer it")
    return f": {' and '.join(parts)}" if parts else ""


# --- the plot ------------------------------------------------------------------------------


_ACT_SHADES = {
    FILLING: "#e8f4e8",
    QUEUE_BEFORE_FULL: "#fdf0d5",
    SATURATED: "#fde2c8",
    FULL_NOBODY_WAITING: "#f5f5dc",
    STORM: "#f8d0d0",
    DRAINING: "#e0e8f8",
    NEVER_FULL: "#f0f0f0",
}


def plot_kv_timeline(k: KvPressureResult, title: str) -> bytes:
    plt = pyplot()
    t = [p.t for p in k.timeline]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    # Each act shaded from its first poll to the next act's first poll.
    ends = [a.start_t for a in k.acts[1:]] + [k.acts[-1].end_t if k.acts else 0.0]
    for act, end in zip(k.acts, ends, strict=True):
        for ax in (top, bottom):
            ax.axvspan(act.start_t, end, color=_ACT_SHADES.get(act.name, "#f0f0f0"), lw=0)
        top.annotate(
            act.name,
            (act.start_t, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -10),
            textcoords="offset points",
            fontsize=7,
            color="#555555",
        )
    top.step(t, [p.running or 0 for p in k.timeline], where="post", label="running")
    top.step(t, [p.waiting or 0 for p in k.timeline], where="post", label="waiting")
    top.set_ylabel("requests")
    usage = top.twinx()
    usage.plot(
        t,
        [(p.kv_cache_usage or 0) * 100 for p in k.timeline],
        color="tab:red",
        lw=1.5,
        marker=".",
        ms=3,
        label="KV cache usage",
    )
    for m in k.missed_polls:
        usage.axvline(m.t, color="black", ls=":", lw=1)
    usage.set_ylabel("KV cache usage %")
    usage.set_ylim(0, 105)
    lines = top.get_legend_handles_labels()
    more = usage.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center right")
    top.set_title(f"{title}: the pool fills, requests queue, vLLM preempts")
    top.grid(alpha=0.3)
    jumps = preemption_jumps(k.timeline)
    width = (t[-1] - t[0]) / max(len(t), 1) * 0.8 if len(t) > 1 else 1.0
    bottom.bar(t, jumps, width=width, color="tab:purple", label="preemptions in the poll")
    cumulative = bottom.twinx()
    cumulative.plot(
        t, [p.preemptions for p in k.timeline], color="black", lw=1, label="preemptions, total"
    )
    bottom.set_ylabel("per poll")
    cumulative.set_ylabel("total")
    bottom.set_xlabel("seconds since the flood started")
    bottom.grid(alpha=0.3)
    lines = bottom.get_legend_handles_labels()
    more = cumulative.get_legend_handles_labels()
    bottom.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    return png(fig)


def plots(phase: PhaseResult, k: KvPressureResult) -> dict[str, bytes]:
    return {plot_name(phase, "timeline"): plot_kv_timeline(k, phase.name)} if k.timeline else {}


EXPERIMENT = Experiment(
    KIND, KvPressurePhase, KvPressureResult, parse, run, summary, section, plots
)
