"""Running a plan: each phase against a freshly started server, results as they come.

The run is I/O glue around the pure parts: the backend starts servers, `VllmClient`
sends requests and reads counters, `analysis` turns them into results, observers
(phase-info series, Grafana annotations, the demo's exporter) watch the segments, and
`publish` writes the report after every phase. A phase that fails is recorded with its
error and the next phase runs; an interrupt stops the run. `run_lab` always calls
`backend.restore()`, shielded from a second Ctrl-C.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from vllm_glassbox import __version__
from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.derive import Increase
from vllm_glassbox.exporter.snapshot import Snapshot

from .analysis import (
    checkpoint_weights,
    fit_tpot,
    pressure_summary,
    request_stats,
    spec_runs,
    startup_facts,
    timeline_point,
)
from .backend import Backend, Deployed, FlagOverrides, Terminated, restoring
from .measure import Completion, LabError, Measured, Sampler, VllmClient, increase
from .plan import KvPressurePhase, Phase, Plan, QuantizationPhase, Request, SpecDecodePhase
from .progress import Progress
from .results import (
    KvPressureResult,
    LabResults,
    PhaseBody,
    PhaseResult,
    QuantizationResult,
    RequestStats,
    SpecDecodeResult,
    Startup,
    TimelinePoint,
    VariantResult,
)
from .server_process import ServerError
from .telemetry import Observer, Segment

PROGRESS_POLL_SECONDS = 2.0


STOPPED = (KeyboardInterrupt, Terminated)  # Ctrl-C, SIGTERM: stop, restore, report


@dataclass
class Served:
    deployed: Deployed
    client: VllmClient
    startup: Startup


@dataclass
class Lab:
    backend: Backend
    progress: Progress
    observers: Sequence[Observer] = ()
    publish: Callable[[LabResults], None] = lambda results: None
    wall: Callable[[], float] = time.time
    results: LabResults = field(init=False)

    # --- the run ---------------------------------------------------------------------------

    def run(self, plan: Plan) -> LabResults:
        self.results = LabResults(plan.name, self.backend.name, self.wall(), version=__version__)
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
        run: Callable[[], PhaseBody]
        if isinstance(phase, QuantizationPhase):
            run = lambda: self._quantization(phase)  # noqa: E731
        elif isinstance(phase, KvPressurePhase):
            run = lambda: self._kv_pressure(phase)  # noqa: E731
        else:
            run = lambda: self._spec_decode(phase)  # noqa: E731
        try:
            body = run()
        except STOPPED:
            self.results.phases.append(
                PhaseResult(
                    phase.name, phase.kind, "interrupted", started, self.wall(), error="interrupted"
                )
            )
            raise
        except _PhaseFailed as e:
            return PhaseResult(
                phase.name, phase.kind, "failed", started, self.wall(), e.body, e.message
            )
        except Exception as e:  # the next phase still runs
            self.progress.note(f"✗ {phase.name}: {_describe(e)}")
            return PhaseResult(
                phase.name, phase.kind, "failed", started, self.wall(), error=_describe(e)
            )
        return PhaseResult(phase.name, phase.kind, "ok", started, self.wall(), body)

    # --- one server start and its workload --------------------------------------------------

    @contextlib.contextmanager
    def _segment(self, phase: Phase, variant: str, overrides: FlagOverrides) -> Iterator[Served]:
        segment = Segment(phase.name, phase.kind, variant, self.wall())
        self.progress.begin(phase.name, variant or None)
        for o in self.observers:
            o.segment_started(segment)
        error: str | None = None
        try:
            self.progress.status("starting the server")
            t0 = time.monotonic()
            deployed = self.backend.deploy(overrides)
            startup_seconds = time.monotonic() - t0
            client = VllmClient(deployed.url, deployed.served_model_name)
            try:
                startup = startup_facts(
                    deployed.startup_log,
                    client.snapshot(),
                    deployed.served_model_name,
                    startup_seconds,
                    checkpoint=lambda: checkpoint_weights(deployed.model_dir),
                    log_path=deployed.log_path,
                )
                self.progress.note(f"▸ {segment.title}: {_startup_line(startup)}")
                for o in self.observers:
                    o.server_ready(segment, deployed)
                yield Served(deployed, client, startup)
            finally:
                client.close()
        except BaseException as e:
            error = _describe(e)
            raise
        finally:
            ended = self.wall()
            for o in self.observers:
                o.segment_ended(segment, ended, error)

    def _measure(self, served: Served, bodies: list[dict[str, object]]) -> Measured:
        """Requests one after the other, with live token progress from /metrics."""
        total = float(sum(int(str(b["max_tokens"])) for b in bodies))
        start: list[Snapshot] = []

        def on_sample(t: float, snap: Snapshot) -> None:
            if not start:
                start.append(snap)
            self.progress.tokens(increase(start[0], snap, t)[s.GENERATION_TOKENS], total)

        self.progress.status(f"{len(bodies)} request(s)")
        with Sampler(served.client, PROGRESS_POLL_SECONDS, on_sample):
            measured = served.client.measure(bodies)
        self.progress.tokens(measured.increase[s.GENERATION_TOKENS], total)
        return measured

    # --- quantization ------------------------------------------------------------------------

    def _quantization(self, phase: QuantizationPhase) -> QuantizationResult:
        variants: list[VariantResult] = []
        for v in phase.variants:
            overrides = {**phase.flags, "--model": v.model, **v.flags}
            try:
                with self._segment(phase, v.name, overrides) as served:
                    body = phase.request.body(served.deployed.served_model_name)
                    if phase.warmup:
                        self.progress.status(f"{phase.warmup} warm-up request(s)")
                        for _ in range(phase.warmup):
                            served.client.complete(body)
                    measured = self._measure(served, [body] * phase.requests)
                    stats = request_stats(measured.completions, measured.increase)
                    variants.append(VariantResult(v.name, v.model, v.fit, served.startup, stats))
                    self.progress.note(f"  {v.name}: {_stats_line(stats)}")
            except STOPPED:
                raise
            except Exception as e:  # the other variants still run
                self.progress.note(f"✗ {phase.name} › {v.name}: {_describe(e)}")
                variants.append(VariantResult(v.name, v.model, v.fit, error=_describe(e)))
        fit, problem = fit_tpot(variants)
        result = QuantizationResult(tuple(variants), fit, problem)
        if all(v.error for v in variants):
            raise _PhaseFailed("every variant failed", result)
        return result

    # --- kv-pressure ---------------------------------------------------------------------------

    def _kv_pressure(self, phase: KvPressurePhase) -> KvPressureResult:
        overrides = {**phase.flags, **({"--model": phase.model} if phase.model else {})}
        with self._segment(phase, "", overrides) as served:
            client = served.client
            bodies = [
                phase.request.body(served.deployed.served_model_name, i=i)
                for i in range(phase.concurrency)
            ]
            total = float(phase.request.max_tokens * phase.concurrency)
            baseline = client.snapshot()
            timeline: list[TimelinePoint] = []

            def on_sample(t: float, snap: Snapshot) -> None:
                point = timeline_point(t, baseline, snap)
                timeline.append(point)
                self.progress.tokens(point.generated_tokens, total)
                self.progress.status(_pressure_line(point))

            self.progress.status(f"flood of {phase.concurrency} requests")
            pool = concurrent.futures.ThreadPoolExecutor(phase.concurrency, "flood")
            started = time.monotonic()
            try:
                futures = [pool.submit(client.complete, b) for b in bodies]
                with Sampler(client, phase.poll_seconds, on_sample):
                    done, pending = concurrent.futures.wait(futures, phase.timeout_seconds)
            finally:
                # Never wait for requests in flight: restore() stops the server under them.
                pool.shutdown(wait=False, cancel_futures=True)
            completions = [f.result() for f in done if f.exception() is None]
            errors = [_describe(e) for f in done if (e := f.exception()) is not None]
            final = client.settled_snapshot(
                baseline, sum(c.completion_tokens for c in completions), len(completions)
            )
            timeline.append(timeline_point(time.monotonic() - started, baseline, final))
            summary = pressure_summary(timeline, phase.saturation)
            result = KvPressureResult(
                startup=served.startup,
                requests=phase.concurrency,
                completed=len(completions),
                failed=len(errors) + len(pending),
                flood_seconds=time.monotonic() - started,
                timeline=tuple(timeline),
                request_errors=tuple(sorted(set(errors)))[:10],
                **summary,  # type: ignore[arg-type]
            )
            self.progress.note(
                f"  flood: {result.completed}/{result.requests} done, "
                f"{result.preemptions_total:g} preemptions, "
                f"largest jump {result.max_preemption_jump:g} in one poll"
            )
            if pending:
                raise _PhaseFailed(
                    f"{len(pending)} request(s) still running after "
                    f"{phase.timeout_seconds:g}s (timeout)",
                    result,
                )
            if errors:
                raise _PhaseFailed(f"{len(errors)} request(s) failed: {errors[0]}", result)
            return result

    # --- spec-decode ---------------------------------------------------------------------------

    def _spec_decode(self, phase: SpecDecodePhase) -> SpecDecodeResult:
        overrides = {**phase.flags, **({"--model": phase.model} if phase.model else {})}
        with self._segment(phase, "", overrides) as served:
            model = served.deployed.served_model_name

            def body(extra: dict[str, object]) -> dict[str, object]:
                return with_extra(phase.request, model, extra)

            # The first request after startup pays one-time costs (the ngram proposer's
            # JIT compilation): measured alone, reported apart, kept out of the runs.
            self.progress.status("cold first request")
            cold = served.client.measure([body(dict(phase.runs[0].extra))])
            cold_stats = request_stats(cold.completions, cold.increase)
            measured: list[tuple[str, dict[str, object], bool, RequestStats]] = []
            warm = Increase({}, 0.0)
            for run in phase.runs:
                self.progress.begin(phase.name, run.label)
                m = self._measure(served, [body(dict(run.extra))] * phase.requests)
                stats = request_stats(m.completions, m.increase)
                warm = warm.then(m.increase)  # the runs one after another
                measured.append((run.label, dict(run.extra), run.baseline, stats))
                self.progress.note(f"  {run.label}: {_stats_line(stats)}")
            runs, speedup = spec_runs(measured)
            warm_stats = request_stats([], warm)
            return SpecDecodeResult(
                startup=served.startup,
                runs=tuple(runs),
                speedup=speedup,
                first_request_prefill_seconds=cold_stats.prefill_seconds,
                first_request_ttft_seconds=cold_stats.ttft_seconds,
                warm_prefill_seconds=warm_stats.prefill_seconds,
            )


class _PhaseFailed(Exception):
    """A phase that measured something but did not complete: both are reported."""

    def __init__(self, message: str, body: PhaseBody) -> None:
        super().__init__(message)
        self.message = message
        self.body = body


def with_extra(request: Request, model: str, extra: dict[str, object]) -> dict[str, object]:
    return {**request.body(model), **extra}


def _describe(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    if isinstance(e, LabError | ServerError | ValueError | OSError):
        return text
    return f"{type(e).__name__}: {text}"


def _fmt(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    return "–" if value is None else f"{value * scale:.{digits}g}{unit}"


def _startup_line(st: Startup) -> str:
    return (
        f"ready in {st.startup_seconds:.0f}s, weights {_fmt(st.weights_gib, ' GiB')} "
        f"({st.weights_source or 'unknown'}), KV {st.kv_cache_tokens or '–'} tokens in "
        f"{st.kv_cache_blocks or '–'} blocks of {st.block_size or '–'}"
    )


def _stats_line(st: RequestStats) -> str:
    line = (
        f"{st.generated_tokens:g} tokens, TTFT {_fmt(st.ttft_seconds, ' ms', 1000)}, "
        f"TPOT {_fmt(st.tpot_seconds, ' ms', 1000)}, "
        f"{_fmt(st.tokens_per_forward_pass)} tokens/forward pass"
    )
    if st.drafts:
        line += f", {st.drafts:g} drafts, {st.accepted_tokens:g}/{st.draft_tokens:g} accepted"
    return line


def _pressure_line(p: TimelinePoint) -> str:
    usage = "–" if p.kv_cache_usage is None else f"{p.kv_cache_usage:.0%}"
    return (
        f"running {_fmt(p.running)}, waiting {_fmt(p.waiting)}, KV {usage}, "
        f"preemptions {p.preemptions:g}"
    )


def run_lab(plan: Plan, lab: Lab) -> LabResults:
    """Run the plan; whatever happens, restore the backend before returning or raising.

    `restoring` (shared with the Kubernetes backend's tests) turns SIGTERM into
    `Terminated` and ignores further Ctrl-C / SIGTERM while `restore()` runs.
    """
    with restoring(lab.backend):
        return lab.run(plan)


__all__ = ["STOPPED", "Completion", "Lab", "LabError", "Terminated", "run_lab"]
