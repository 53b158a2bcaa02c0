"""Every published value is right or absent: the real poller fed random sequences of real
captured pages, perturbed as production perturbs them, against an oracle written apart
from the derivation core.

The pages are the vLLM 0.32 CPU captures of two processes (a speculating server, then a
plain one: tests/fixtures/README.md). A sequence polls one server, or restarts into the
other, or alternates between them (replicas behind a Service); any poll may lose some
families (a lazily created family, a restarting server's early page), be cut at a line,
carry a TTFT sum that stepped back (the wall clock), or be answered seconds late; the
clock between polls varies. The oracle reads the raw counters with prometheus_client's
own parser and does the arithmetic by hand: a windowed value the exporter publishes must
equal the oracle's over the same two polls, within float rounding.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import Fetcher
from vllm_glassbox.exporter.service import Poller, make_registry

from tests.exporter.test_exposition_golden import Clock, config
from tests.fixtures import page

SPEC = [
    "cpu-0.32/spec-idle.txt",
    "cpu-0.32/spec-after-1x256.txt",
    "cpu-0.32/spec-after-2x256.txt",
    "cpu-0.32/flood-mid.txt",
    "cpu-0.32/flood-after.txt",
]
PLAIN = [
    "cpu-0.32/plain-idle.txt",
    "cpu-0.32/plain-after-1x64.txt",
    "cpu-0.32/plain-after-3x64.txt",
]
DROPPABLE = (
    "vllm:spec_decode_",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:generation_tokens",
)
ENGINE = {"model_name": "tiny", "engine": "0"}
COMPARED: dict[str, int] = {}  # values compared with the oracle, by series (for -s)


@dataclass(frozen=True)
class Poll:
    server: int  # 0: the speculating server, 1: the plain one
    index: int  # which of its pages
    dropped: tuple[str, ...]  # families left off the page
    cut_at: int | None  # the page cut after this many lines
    ttft_back: bool  # its TTFT sum stepped back by a second
    gap: float  # seconds since the previous poll was sent
    delay: float  # seconds vLLM took to answer

    def truth(self) -> str:
        """The page as vLLM rendered it (a stepped-back sum is vLLM's own number)."""
        text = page((SPEC, PLAIN)[self.server][self.index])
        if self.ttft_back:
            text = re.sub(
                r"^(vllm:time_to_first_token_seconds_sum\{[^}]*\}) (\S+)$",
                lambda m: f"{m.group(1)} {max(float(m.group(2)) - 1.0, 0.0)!r}",
                text,
                flags=re.M,
            )
        return text

    def served(self) -> str:
        """What reached the exporter."""
        lines = [
            line
            for line in self.truth().splitlines()
            if not any(re.sub(r"^# (HELP|TYPE) ", "", line).startswith(p) for p in self.dropped)
        ]
        if self.cut_at is not None:
            lines = lines[: self.cut_at]
        return "\n".join(lines) + "\n"


@st.composite
def sequences(draw: st.DrawFn) -> tuple[str, list[Poll]]:
    mode = draw(st.sampled_from(["one server", "restart", "alternate"]))
    n = draw(st.integers(3, 10))
    polls = []
    index = [0, 0]
    server = 0
    for i in range(n):
        if mode == "alternate":
            server = i % 2
        elif mode == "restart" and i == n // 2:
            server = 1
        size = len((SPEC, PLAIN)[server])
        index[server] = min(size - 1, index[server] + draw(st.integers(0, 2)))
        rare = st.integers(0, 9).map(lambda x: x == 0)
        polls.append(
            Poll(
                server,
                index[server],
                tuple(p for p in DROPPABLE if draw(rare)),
                draw(st.integers(10, 400)) if draw(rare) else None,
                draw(rare),
                float(draw(st.integers(1, 15))),
                float(draw(st.sampled_from([0, 0, 0, 1, 4, 9]))),
            )
        )
    return mode, polls


class Served(Fetcher):
    """Each /metrics answer is the next poll's page, after its delay on the fake clock."""

    def __init__(self, polls: list[Poll], clock: Clock) -> None:
        self.polls, self.clock = list(polls), clock

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        if path == "/version":
            return '{"version": "0.32.0"}'
        if path != "/metrics":
            raise ScrapeError("http_status", f"{path}: HTTP 404")
        poll = self.polls.pop(0)
        self.clock.now += poll.delay
        return poll.served()

    def close(self) -> None:
        pass


# --- the oracle: raw counters by prometheus_client's parser, arithmetic by hand -----------


def raw(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def by_hand(polls: list[Poll]) -> dict[str, float]:
    """tokens per forward pass, draft coverage and TTFT over consecutive polls read: each
    step the later page less the earlier, or, where the server changed, the later page's
    counters whole (a new process counts from zero)."""
    grown: dict[str, float] = {}
    speculating = True
    for before, after in itertools.pairwise(polls):
        a, b = raw(before.truth()), raw(after.truth())
        same = before.server == after.server
        speculating = speculating and "vllm:spec_decode_num_drafts_total" in b
        for name, value in b.items():
            grown[name] = grown.get(name, 0.0) + value - (a.get(name, 0.0) if same else 0.0)

    def grew(name: str) -> float:
        return grown.get(name, 0.0)

    steps = grew("vllm:inter_token_latency_seconds_count")
    decode = grew("vllm:generation_tokens_total") - grew("vllm:time_to_first_token_seconds_count")
    out = {}
    if steps > 0:
        out["glassbox_tokens_per_forward_pass"] = decode / steps
        if speculating:
            out["glassbox_spec_decode_draft_coverage_ratio"] = (
                grew("vllm:spec_decode_num_drafts_total") / steps
            )
    if grew("vllm:time_to_first_token_seconds_count") > 0:
        out["glassbox_time_to_first_token_seconds"] = grew(
            "vllm:time_to_first_token_seconds_sum"
        ) / grew("vllm:time_to_first_token_seconds_count")
    return out


def published(poller: Poller) -> dict[str, float]:
    text = generate_latest(make_registry(poller)).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if {k: sample.labels.get(k) for k in ENGINE} == ENGINE
    }


@settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(sequences())
def test_every_published_value_is_right_or_absent(history: tuple[str, list[Poll]]) -> None:
    mode, polls = history
    clock = Clock()
    poller = Poller(config(), fetcher=Served(polls, clock), clock=clock)
    received: list[tuple[float, Poll]] = []  # the polls read, by the time they came
    for i, poll in enumerate(polls):
        clock.now += poll.gap
        if poller.poll_once():
            received.append((clock.now, poll))
        values = published(poller)
        window = values.get("glassbox_window_covered_seconds")
        read = [p.server for _, p in received]
        switches = sum(a != b for a, b in itertools.pairwise(read))
        if mode == "alternate" and switches >= 2:  # the exporter has seen the pattern
            assert "glassbox_tokens_per_forward_pass" not in values, (i, values)
            continue
        if window is None or not received:
            continue
        end_at = received[-1][0]
        assert any(abs(at - (end_at - window)) < 1e-6 for at, _ in received), window
        between = [p for at, p in received if end_at - window - 1e-6 <= at <= end_at]
        if len({p.server for p in between}) > 1:
            assert mode != "one server"  # a restart, or the first switch of replicas
        expected = by_hand(between)
        for name in (
            "glassbox_tokens_per_forward_pass",
            "glassbox_spec_decode_draft_coverage_ratio",
            "glassbox_time_to_first_token_seconds",
        ):
            if name in values:
                COMPARED[name] = COMPARED.get(name, 0) + 1
                assert name in expected, (name, values[name], between)
                assert abs(values[name] - expected[name]) <= 1e-9 * max(1.0, expected[name]), (
                    name,
                    values[name],
                    expected[name],
                    between,
                )


def test_the_property_compared_values_of_every_series() -> None:
    """Run after the property (same module, in order): it compared something of each."""
    assert set(COMPARED) == {
        "glassbox_tokens_per_forward_pass",
        "glassbox_spec_decode_draft_coverage_ratio",
        "glassbox_time_to_first_token_seconds",
    }, COMPARED
    print(f"values compared with the oracle: {COMPARED}")
