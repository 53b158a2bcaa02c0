"""The storm finding through the real poller and explain, against what happened over the
window as VLLMPreemptionStorm judges it.

Random sequences of polls are built from a captured page of a storm (vLLM 0.24.0 on one
H200, tests/fixtures/README.md): each poll is that page with the pool's usage, the queue
and the preemption counter set to one step of a storm — filling, preempting, a dip (the
blocks preemptions free), draining, a restart (a new process start, the counter from
zero). The poller reads them at the chart's defaults (5 s polls, a 60 s window) on an
injected clock. The oracle is apart from the code: each served page read back with
prometheus_client's parser, the window's polls picked and its counter's increase summed
by hand (a restart counts its new process from zero)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.findings import Finding
from vllm_glassbox.exporter.exposition import unrecognised_inputs
from vllm_glassbox.exporter.scene import scene_from_state
from vllm_glassbox.exporter.service import Poller

from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.fixtures import page

CAPTURED = page("cuda-0.24.0-h200/flood-preempting.txt")
INTERVAL, WINDOW = 5.0, 60.0


@dataclass(frozen=True)
class Step:
    kind: str  # fill, storm, dip, drain, restart
    usage: float
    waiting: int
    preempted: int  # preemptions since the poll before (restart: the new counter)


def served(usage: float, waiting: int, preemptions: int, start: float) -> str:
    """The captured page with this poll's pool, queue and counter."""
    text = CAPTURED
    for name, value in (
        (r"vllm:kv_cache_usage_perc\{[^}]*\}", usage),
        (r"vllm:num_requests_waiting\{[^}]*\}", waiting),
        (r'vllm:num_requests_waiting_by_reason\{[^}]*reason="capacity"\}', waiting),
        (r"vllm:num_preemptions_total\{[^}]*\}", preemptions),
        (r"process_start_time_seconds", start),
    ):
        text, n = re.subn(rf"^({name}) \S+$", rf"\g<1> {float(value)!r}", text, flags=re.M)
        assert n == 1, name
    return text


@dataclass(frozen=True)
class Seen:
    at: float
    usage: float
    waiting: float
    preemptions: float
    start: float


ORACLE_READS = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_waiting_by_reason",
    "vllm:num_preemptions_total",
    "process_start_time_seconds",
)


def seen(text: str, at: float) -> Seen:
    """One served page as prometheus_client's parser reads it (the families it needs:
    their TYPE and HELP lines and samples, whole)."""
    wanted = "\n".join(
        line
        for line in text.splitlines()
        if any(re.match(rf"(# (HELP|TYPE) )?{re.escape(n)}[ {{]", line) for n in ORACLE_READS)
    )
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            reason = sample.labels.get("reason")
            if sample.name == "vllm:num_requests_waiting_by_reason" and reason == "capacity":
                values["waiting"] = sample.value
            elif sample.name in (
                "vllm:kv_cache_usage_perc",
                "vllm:num_preemptions_total",
                "process_start_time_seconds",
            ):
                values[sample.name] = sample.value
    return Seen(
        at,
        values["vllm:kv_cache_usage_perc"],
        values["waiting"],
        values["vllm:num_preemptions_total"],
        values["process_start_time_seconds"],
    )


def oracle(history: list[Seen]) -> tuple[bool, float, float, float]:
    """The window's facts by hand: (the alert's condition, preemptions, peak usage, peak
    waiting for capacity)."""
    latest = history[-1].at
    inside = [p for p in history if p.at >= latest - WINDOW]
    counted = 0.0
    for before, poll in itertools.pairwise(inside):
        restarted = poll.start != before.start or poll.preemptions < before.preemptions
        counted += poll.preemptions if restarted else poll.preemptions - before.preemptions
    usage = max(p.usage for p in inside)
    waiting = max(p.waiting for p in inside)
    storm = len(inside) >= 2 and counted >= 3 and usage >= 0.9 and waiting > 0
    return storm, counted, usage, waiting


def realistic(steps: list[Step]) -> list[Step]:
    """A restarted vLLM takes longer than a poll to start again: no two restarts in a row
    (the poller takes those for several servers behind one target, server_trail.py)."""
    out: list[Step] = []
    for step in steps:
        if step.kind == "restart" and out and out[-1].kind == "restart":
            step = Step("drain", step.usage, 0, 0)
        out.append(step)
    return out


STEPS = st.one_of(
    st.builds(Step, st.just("fill"), st.floats(0.3, 0.89), st.just(0), st.just(0)),
    st.builds(Step, st.just("storm"), st.floats(0.9, 1.0), st.integers(1, 17), st.integers(1, 11)),
    st.builds(Step, st.just("dip"), st.floats(0.5, 0.89), st.integers(0, 17), st.integers(0, 3)),
    st.builds(Step, st.just("drain"), st.floats(0.0, 0.5), st.just(0), st.just(0)),
    st.builds(Step, st.just("restart"), st.floats(0.0, 0.3), st.just(0), st.integers(0, 2)),
)


def storm_of(poller: Poller) -> Finding | None:
    assert poller.state is not None
    scene = scene_from_state(poller.state, unrecognised_inputs(poller.state))
    found = [f for f in explain(scene).findings if f.finding == "preemption_storm"]
    return found[0] if found else None


def run(steps: list[Step]) -> list[tuple[bool, Finding | None, tuple[bool, float, float, float]]]:
    """Each poll: whether the oracle holds the storm, the finding, the oracle's facts."""
    start, total = 1.79602431044e9, 0
    pages = []
    for step in steps:
        if step.kind == "restart":
            start, total = start + 100.0, step.preempted
        else:
            total += step.preempted
        pages.append(served(step.usage, step.waiting, total, start))
    clock = Clock()
    poller = Poller(
        config(interval_seconds=INTERVAL, window_seconds=WINDOW),
        fetcher=PageSequence(list(pages), "0.24.0"),
        clock=clock,
    )
    history: list[Seen] = []
    out = []
    for text in pages:
        assert poller.poll_once()
        history.append(seen(text, clock.now))
        facts = oracle(history)
        out.append((facts[0], storm_of(poller), facts))
        clock.now += INTERVAL
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEPS, min_size=2, max_size=20).map(realistic))
def test_the_storm_is_named_exactly_while_its_window_holds_the_alerts_condition(
    steps: list[Step],
) -> None:
    for i, (storm, finding, (_, counted, usage, waiting)) in enumerate(run(steps)):
        assert (finding is not None) == storm, (i, steps[: i + 1])
        if finding is not None:
            figures = finding.what.figures
            assert figures["preempted"].value == counted
            assert figures["fill"].value == usage
            assert figures["waiting"].value == waiting


def test_one_dipped_poll_inside_a_storm_changes_nothing() -> None:
    """Preempting at 98 %, then a poll at 60 % with nobody waiting (the blocks the
    preemptions freed): the storm is still named, its peak still 98 %."""
    steps = [Step("fill", 0.83, 0, 0), Step("storm", 0.98, 4, 4), Step("storm", 0.97, 10, 6)]
    steps += [Step("dip", 0.6, 0, 0), Step("storm", 0.99, 8, 3)]
    polls = run(steps)
    assert [storm for storm, _, _ in polls] == [False, True, True, True, True]
    assert [f is not None for _, f, _ in polls] == [False, True, True, True, True]
    dipped = polls[3][1]
    assert dipped is not None and dipped.what.figures["fill"].value == 0.98
    assert dipped.what.figures["now"].value == 0.6


def test_the_storm_leaves_with_its_last_preemption_from_the_window() -> None:
    """Ten preemptions, then drained: named while they are inside the 60 s window (12
    polls), gone at the first poll after."""
    steps = [Step("storm", 0.98, 5, 0), Step("storm", 0.99, 5, 10)]
    steps += [Step("drain", 0.1, 0, 0)] * 14
    polls = run(steps)
    named = [f is not None for _, f, _ in polls]
    assert named == [storm for storm, _, _ in polls]
    assert named.index(False, 1) == 13  # the poll at 65 s no longer sees the one at 5 s
    last = polls[12][1]
    assert last is not None and last.what.figures["ago"].value == 55.0
