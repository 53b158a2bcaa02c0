"""Running a plan: each phase against a freshly started server, results as they come.

The run is I/O glue around the pure parts: the backend starts servers, `VllmClient`
sends requests and reads counters, each phase's kind (`lab/experiments/`) runs its
workload through the services `Lab` provides (`experiments.base.Services`: `segment`,
`measure_each`, `warm_up`, progress, the exporter beside) and turns what it measured
into its result, observers (phase-info series, Grafana annotations, the exporter
beside) watch the segments, and `publish` writes the report after every phase. A phase
that fails is recorded with its error and the next phase runs; an interrupt stops the
run. `run_lab` always calls `backend.restore()`, shielded from a second Ctrl-C; the
commands assemble a whole run in `launch.py`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vllm_glassbox import __version__
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import snapshot_increases
from vllm_glassbox.core.snapshot import Snapshot
from vllm_glassbox.lab.analysis import checkpoint_weights, segment_values, startup_facts
from vllm_glassbox.lab.backends.backend import Backend, FlagOverrides, Terminated, restoring
from vllm_glassbox.lab.compared import compare_segment, kept
from vllm_glassbox.lab.experiments import for_phase
from vllm_glassbox.lab.experiments.base import (
    STOPPED,
    ExporterView,
    Phase,
    PhaseFailed,
    Served,
    describe_error,
)
from vllm_glassbox.lab.plan import Plan
from vllm_glassbox.lab.progress import Progress, number_text
from vllm_glassbox.lab.results import (
    ExporterSeries,
    LabResults,
    Peak,
    PhaseResult,
    SegmentNumbers,
    Startup,
)
from vllm_glassbox.lab.telemetry import Observer, Segment
from vllm_glassbox.lab.vllm.client import (
    Completion,
    LabError,
    Measured,
    Sampler,
    VllmClient,
    increase,
)
from vllm_glassbox.lab.vllm.credentials import ApiKey

PROGRESS_POLL_SECONDS = 2.0
# A warm-up request pays the first request's one-time costs (in vLLM's API server and
# its kernels: the prefill, the first decode steps); the rest of its tokens would only
# make the run longer (on the demo's large model, 12 s a start).
WARM_UP_TOKENS = 16


@dataclass
class Lab:
    backend: Backend
    progress: Progress
    observers: Sequence[Observer] = ()
    publish: Callable[[LabResults], None] = lambda results: None
    wall: Callable[[], float] = time.time
    peak: Peak | None = None  # the hardware's peak memory bandwidth, when known
    api_key: ApiKey | None = None  # a vLLM started with --api-key
    out_dir: Path | None = None  # where a kind keeps files of its own (the benchmark's JSON)
    notes: Sequence[str] = ()  # said at the top of the report
    results: LabResults = field(init=False)

    @property
    def peak_bandwidth(self) -> float | None:
        return self.peak.bytes_per_second if self.peak else None

    @property
    def exporter(self) -> ExporterView | None:
        """The exporter beside the servers, when one of the observers is."""
        # Here, not at the top: the lab loads the exporter's service only when it runs one.
        from vllm_glassbox.lab.sidecar import ExporterBeside

        return next((o for o in self.observers if isinstance(o, ExporterBeside)), None)

    # --- the run ---------------------------------------------------------------------------

    def run(self, plan: Plan) -> LabResults:
        self.results = LabResults(
            plan.name,
            self.backend.name,
            self.wall(),
            version=__version__,
            description=plan.description,
            peak=self.peak,
            notes=list(self.notes),
        )
        try:
            for phase in plan.phases:
                self.results.phases.append(self._phase(phase))
                self.publish(self.results)
            failed = [p.name for p in self.results.phases if p.status != "ok"]
            self.results.status = "failed" if failed else "ok"
        except STOPPED:
            self.results.status = "interrupted"
            raise
        finally:
            self.results.ended_at = self.wall()
            self.publish(self.results)
            self.progress.status("restoring")
        return self.results

    def _phase(self, phase: Phase) -> PhaseResult:
        started = self.wall()
        try:
            body = for_phase(phase).run(self, phase)
        except STOPPED:
            self.results.phases.append(
                PhaseResult(
                    phase.name, phase.kind, "interrupted", started, self.wall(), error="interrupted"
                )
            )
            raise
        except PhaseFailed as e:
            return PhaseResult(
                phase.name, phase.kind, "failed", started, self.wall(), e.body, e.message
            )
        except Exception as e:  # the next phase still runs
            self.progress.note(f"✗ {phase.name}: {describe_error(e)}")
            return PhaseResult(
                phase.name, phase.kind, "failed", started, self.wall(), error=describe_error(e)
            )
        return PhaseResult(phase.name, phase.kind, "ok", started, self.wall(), body)

    # --- one server start and its workload --------------------------------------------------

    @contextlib.contextmanager
    def segment(self, phase: Phase, variant: str, overrides: FlagOverrides) -> Iterator[Served]:
        segment = Segment(phase.name, phase.kind, variant, self.wall())
        self.progress.begin(phase.name, variant or None)
        for o in self.observers:
            o.segment_started(segment)
        error: str | None = None
        try:
            self.progress.status("starting the server")
            t0 = time.monotonic()
            deployed = self.backend.deploy(overrides)
            startup_seconds = deployed.startup_seconds
            if startup_seconds is None:
                startup_seconds = time.monotonic() - t0
            client = VllmClient(deployed.url, deployed.served_model_name, api_key=self.api_key)
            try:
                first = client.snapshot()
                startup = startup_facts(
                    deployed.startup_log,
                    first,
                    deployed.served_model_name,
                    startup_seconds,
                    checkpoint=lambda: checkpoint_weights(deployed.model_dir),
                    log_path=deployed.log_path,
                    model_dir=deployed.model_dir,
                )
                kept = "the server of the segment before (same args), " if deployed.reused else ""
                self.progress.note(f"▸ {segment.title}: {kept}{_startup_line(startup)}")
                for o in self.observers:
                    o.server_ready(segment, deployed)
                yield Served(deployed, client, startup, first)
                self._segment_numbers(segment, startup, first, client.snapshot())
            finally:
                client.close()
        except BaseException as e:
            error = describe_error(e)
            raise
        finally:
            ended = self.wall()
            for o in self.observers:
                o.segment_ended(segment, ended, error)

    def _segment_numbers(
        self, segment: Segment, startup: Startup, first: Snapshot, last: Snapshot
    ) -> None:
        """The lab's numbers over the whole segment and, with the exporter beside, its page
        at the end and the two compared (each engine apart)."""
        ended = self.wall()
        peak = self.peak_bandwidth
        values = segment_values(increase(first, last, 0.0), startup, peak)
        self.results.segments.append(SegmentNumbers(segment.title, values, startup))
        exporter = self.exporter
        if exporter is None:
            return
        page, fresh = exporter.page_since(ended)
        seen = kept(page)
        if not seen:  # the exporter could not be read
            return
        self.results.exporter.append(ExporterSeries(segment.title, seen))
        by_engine = {
            key: segment_values(d, startup, peak)
            for key, d in snapshot_increases(first, last, 0.0).items()
        }
        self.results.compared += compare_segment(segment.title, page, by_engine, fresh)

    def measure_each(self, served: Served, bodies: list[dict[str, object]]) -> list[Measured]:
        """Requests one after the other, each measured apart, with live token progress."""
        total = float(sum(int(str(b["max_tokens"])) for b in bodies))
        start: list[Snapshot] = []

        def on_sample(t: float, snap: Snapshot, latency: float, delay: float) -> None:
            if not start:
                start.append(snap)
            self.progress.tokens(increase(start[0], snap, t)[s.GENERATION_TOKENS], total)

        self.progress.status(f"{len(bodies)} request(s)")
        with Sampler(served.client, PROGRESS_POLL_SECONDS, on_sample):
            measured = served.client.measure_each(bodies)
        done = sum(m.increase[s.GENERATION_TOKENS] for m in measured)
        self.progress.tokens(done, total)
        return measured

    def warm_up(self, served: Served, body: dict[str, object], count: int) -> None:
        if count:
            self.progress.status(f"{count} warm-up request(s)")
            short = {**body, "max_tokens": min(WARM_UP_TOKENS, _max_tokens(body))}
            for _ in range(count):
                served.client.complete(short)


def _max_tokens(body: dict[str, object]) -> int:
    """The body's `max_tokens`; a body without one gets the warm-up's."""
    value = body.get("max_tokens")
    return value if isinstance(value, int) else WARM_UP_TOKENS


def _startup_line(st: Startup) -> str:
    return (
        f"ready in {st.startup_seconds:.0f}s, weights {number_text(st.weights_gib, ' GiB')} "
        f"({st.weights_source or 'unknown'}), KV {st.kv_cache_tokens or '–'} tokens in "
        f"{st.kv_cache_blocks or '–'} blocks of {st.block_size or '–'}"
    )


def run_lab(plan: Plan, lab: Lab) -> LabResults:
    """Run the plan; whatever happens, restore the backend before returning or raising.

    `restoring` (shared with the Kubernetes backend's tests) turns SIGTERM into
    `Terminated` and ignores further Ctrl-C / SIGTERM while `restore()` runs.
    """
    with restoring(lab.backend):
        return lab.run(plan)


__all__ = ["STOPPED", "Completion", "Lab", "LabError", "Terminated", "run_lab"]
