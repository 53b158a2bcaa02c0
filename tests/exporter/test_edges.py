"""The poll history at its edges, through the real poller and its publication: a page
that came late is stamped when it came (the counters are of that moment, not of when
the poll was sent), so rates over the window are the raw pages' arithmetic.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.service import Poller, make_registry
from vllm_glassbox.exporter.snapshot import read_snapshot

from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.fixtures import page


class LateAnswers(PageSequence):
    """Each /metrics answer takes the next of `delays` seconds of the fake clock."""

    def __init__(self, pages: list[str], clock: Clock, delays: list[float]) -> None:
        super().__init__(list(pages), "0.32.0")
        self.clock, self.delays = clock, delays

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        if path == "/metrics":
            self.clock.now += self.delays.pop(0)
        return super().get_text(path, timeout_seconds)


def _published(poller: Poller, name: str) -> float | None:
    text = generate_latest(make_registry(poller)).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def test_a_page_that_came_late_is_stamped_when_it_came() -> None:
    names = ["cpu-0.32/plain-idle.txt", "cpu-0.32/plain-after-3x64.txt"]
    clock = Clock()
    fetcher = LateAnswers([page(n) for n in names], clock, [0.0, 9.0])
    poller = Poller(config(), fetcher=fetcher, clock=clock)
    poller.poll_once()  # sent and answered at 1000 s
    clock.now += 10.0
    poller.poll_once()  # sent at 1010 s, answered at 1019 s
    first, last = (read_snapshot(page(n)).engines for n in names)
    steps = sum(e.counters[s.ENGINE_STEPS] for e in last.values()) - sum(
        e.counters[s.ENGINE_STEPS] for e in first.values()
    )
    assert steps > 0
    # By hand: the two pages' steps over the 19 s between their answers (not 10 s).
    assert _published(poller, "glassbox_engine_steps_per_second") == steps / 19.0
