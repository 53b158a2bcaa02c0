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
from dataclasses import dataclass, field, replace

from vllm_glassbox import __version__
from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.derive import Increase
from vllm_glassbox.exporter.snapshot import Snapshot
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.analysis import (
    checkpoint_weights,
    request_stats,
    sample,
    segment_values,
    startup_facts,
    timeline_point,
    variant_result,
)
from vllm_glassbox.lab.backend import Backend, Deployed, FlagOverrides, Terminated, restoring
from vllm_glassbox.lab.measure import Completion, LabError, Measured, Sampler, VllmClient, increase
from vllm_glassbox.lab.membench import measure_peak
from vllm_glassbox.lab.plan import (
    KvPressurePhase,
    Phase,
    Plan,
    QuantizationPhase,
    Request,
    SpecDecodePhase,
    SpecRun,
)
from vllm_glassbox.lab.progress import Progress
from vllm_glassbox.lab.results import (
    KvPressureResult,
    LabResults,
    MissedPoll,
    Peak,
    PhaseBody,
    PhaseResult,
    QuantizationResult,
    RequestStats,
    SegmentNumbers,
    SpecDecodeResult,
    Spread,
    Startup,
    TimelinePoint,
    VariantResult,
)
from vllm_glassbox.lab.server_process import ServerError
from vllm_glassbox.lab.telemetry import Observer, Segment

PROGRESS_POLL_SECONDS = 2.0


STOPPED = (KeyboardInterrupt, Terminated)  # Ctrl-C, SIGTERM: stop, restore, report


@dataclass
class Served:
    deployed: Deployed
    client: VllmClient
    startup: Startup
    first: Snapshot  # right after the server was ready: the segment's numbers start here


@dataclass
class Lab:
    backend: Backend
    progress: Progress
    observers: Sequence[Observer] = ()
    publish: Callable[[LabResults], None] = lambda results: None
    wall: Callable[[], float] = time.time
    peak: Peak | None = None  # the hardware's peak memory bandwidth, when known
    results: LabResults = field(init=False)

    @property
    def peak_bandwidth(self) -> float | None:
        return self.peak.bytes_per_second if self.peak else None

    # --- the run ---------------------------------------------------------------------------

    def run(self, plan: Plan) -> LabResults:
        self.results = LabResults(
            plan.name,
            self.backend.name,
            self.wall(),
            version=__version__,
            description=plan.description,
            peak=self.peak,
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
                self.progress.note(f"▸ {segment.title}: {_startup_line(startup)}")
                for o in self.observers:
                    o.server_ready(segment, deployed)
                yield Served(deployed, client, startup, first)
                # The lab's numbers over the whole segment, beside the exporter's.
                d = increase(first, client.snapshot(), 0.0)
                self.results.segments.append(
                    SegmentNumbers(
                        segment.title, segment_values(d, startup, self.peak_bandwidth), startup
                    )
                )
            finally:
                client.close()
        except BaseException as e:
            error = _describe(e)
            raise
        finally:
            ended = self.wall()
            for o in self.observers:
                o.segment_ended(segment, ended, error)

    def _measure_each(self, served: Served, bodies: list[dict[str, object]]) -> list[Measured]:
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

    def _warm_up(self, served: Served, body: dict[str, object], count: int) -> None:
        if count:
            self.progress.status(f"{count} warm-up request(s)")
            for _ in range(count):
                served.client.complete(body)

    # --- quantization ------------------------------------------------------------------------

    def _quantization(self, phase: QuantizationPhase) -> QuantizationResult:
        measured: dict[str, list[tuple[int, Completion, Increase]]] = {
            v.name: [] for v in phase.variants
        }
        startups: dict[str, Startup] = {}
        errors: dict[str, list[str]] = {v.name: [] for v in phase.variants}
        for round_index, v in phase.order():
            overrides = {**phase.flags, "--model": v.model, **v.flags}
            label = v.name if phase.rounds == 1 else f"{v.name} (round {round_index + 1})"
            try:
                with self._segment(phase, label, overrides) as served:
                    body = phase.request.body(served.deployed.served_model_name)
                    self._warm_up(served, body, phase.warmup)
                    this_round = [
                        (round_index, m.completions[0], m.increase)
                        for m in self._measure_each(served, [body] * phase.requests)
                    ]
                    measured[v.name] += this_round
                    startups.setdefault(v.name, served.startup)
                    tpot = findings.spread([sample(*m).tpot_seconds for m in this_round])
                    self.progress.note(f"  {label}: TPOT {_spread_line(tpot)}")
            except STOPPED:
                raise
            except Exception as e:  # the other variants still run
                self.progress.note(f"✗ {phase.name} › {label}: {_describe(e)}")
                prefix = f"round {round_index + 1}: " if phase.rounds > 1 else ""
                errors[v.name].append(prefix + _describe(e))
        variants: list[VariantResult] = []
        for v in phase.variants:
            error = "\n".join(errors[v.name]) or None
            if measured[v.name]:
                done = variant_result(v, startups[v.name], measured[v.name], self.peak_bandwidth)
                variants.append(replace(done, error=error))
            else:
                variants.append(VariantResult(v.name, v.model, v.fit, error=error))
        fit, problem = findings.fit_tpot(variants, phase.tolerance, self.peak_bandwidth)
        result = QuantizationResult(
            tuple(variants), fit, problem, findings.full_size_variants(variants), phase.rounds
        )
        if all(not measured[v.name] for v in phase.variants):
            raise _PhaseFailed("every variant failed", result)
        return result

    # --- kv-pressure ---------------------------------------------------------------------------

    def _kv_pressure(self, phase: KvPressurePhase) -> KvPressureResult:
        overrides = {**phase.flags, **({"--model": phase.model} if phase.model else {})}
        with self._segment(phase, "", overrides) as served:
            client = served.client
            model = served.deployed.served_model_name
            bodies = [phase.request.body(model, i=i) for i in range(phase.concurrency)]
            # A short request first: one-time costs of the first request (in vLLM's API
            # server and its kernels) must not hold back the flood's admission.
            warm = {**bodies[0], "max_tokens": min(16, phase.request.max_tokens)}
            self._warm_up(served, warm, phase.warmup)
            total = float(phase.request.max_tokens * phase.concurrency)
            baseline = client.snapshot()
            timeline: list[TimelinePoint] = []
            missed: list[MissedPoll] = []

            def on_sample(t: float, snap: Snapshot, latency: float, delay: float) -> None:
                point = timeline_point(t, baseline, snap, latency, delay)
                timeline.append(point)
                self.progress.tokens(point.generated_tokens, total)
                self.progress.status(_pressure_line(point))

            def on_missed(t: float, error: str) -> None:
                missed.append(MissedPoll(t, error))
                self.progress.note(f"  poll at {t:.1f}s failed: {error}")

            self.progress.status(f"flood of {phase.concurrency} requests")
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
            errors = [_describe(e) for f in done if (e := f.exception()) is not None]
            final = client.settled_snapshot(
                baseline, sum(c.completion_tokens for c in completions), len(completions)
            )
            timeline.append(timeline_point(time.monotonic() - started, baseline, final))
            summary = findings.pressure_summary(timeline, phase.saturation)
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
                **summary,  # type: ignore[arg-type]
            )
            self.progress.note(
                f"  flood: {result.completed}/{result.requests} done, "
                f"{result.preemptions_total:g} preemptions, "
                f"largest jump {result.max_preemption_jump:g} in one poll, "
                f"acts: {' → '.join(a.name for a in result.acts)}"
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
        model_flag = {"--model": phase.model} if phase.model else {}
        measured: dict[str, tuple[RequestStats, Spread | None, Increase]] = {}
        startups: dict[bool, Startup] = {}
        cold_stats: RequestStats | None = None
        # Runs with speculation on one server, the others on a server without it.
        for speculation in (True, False):
            runs = [r for r in phase.runs if r.speculation == speculation]
            if not runs:
                continue
            flags = phase.flags if speculation else phase.flags_without_speculation
            label = "speculation on" if speculation else "speculation off"
            with self._segment(phase, label, {**flags, **model_flag}) as served:
                startups[speculation] = served.startup
                model = served.deployed.served_model_name
                # The first request after startup pays one-time costs (the ngram
                # proposer's JIT compilation): measured alone, reported apart.
                self.progress.status("cold first request")
                cold = served.client.measure(
                    [with_extra(phase.request, model, dict(runs[0].extra))]
                )
                if cold_stats is None or speculation:
                    cold_stats = request_stats(cold.completions, cold.increase)
                for run in runs:
                    measured[run.label] = self._spec_run(served, phase, run)
        ordered = [
            (r.label, dict(r.extra), r.baseline, r.speculation, *measured[r.label][:2])
            for r in phase.runs
        ]
        runs_result, speedup, problem = findings.spec_runs(ordered)
        warm = Increase({}, 0.0)
        for _, _, d in measured.values():
            warm = warm.then(d)  # the runs one after another
        with_spec = startups.get(True)
        return SpecDecodeResult(
            startup=with_spec or startups.get(False),
            runs=tuple(runs_result),
            speedup=speedup,
            first_request_prefill_seconds=cold_stats.prefill_seconds if cold_stats else None,
            first_request_ttft_seconds=cold_stats.ttft_seconds if cold_stats else None,
            warm_prefill_seconds=request_stats([], warm).prefill_seconds,
            startup_without_speculation=startups.get(False),
            baseline_problem=problem,
            penalty_finding=findings.penalty_finding(
                runs_result,
                with_spec.default_repetition_penalty if with_spec else None,
                with_spec.vllm_version if with_spec else None,
            ),
        )

    def _spec_run(
        self, served: Served, phase: SpecDecodePhase, run: SpecRun
    ) -> tuple[RequestStats, Spread | None, Increase]:
        self.progress.begin(phase.name, run.label)
        body = with_extra(phase.request, served.deployed.served_model_name, dict(run.extra))
        each = self._measure_each(served, [body] * phase.requests)
        total = Increase({}, 0.0)
        for m in each:
            total = total.then(m.increase)
        stats = request_stats([c for m in each for c in m.completions], total)
        tpot = findings.spread(
            [request_stats(m.completions, m.increase).tpot_seconds for m in each]
        )
        self.progress.note(f"  {run.label}: {_stats_line(stats)}")
        return stats, tpot, total


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


def _spread_line(sp: Spread | None) -> str:
    if sp is None:
        return "–"
    return f"{sp.median * 1000:.3g} ms (median of {sp.n}, {sp.low * 1000:.3g}–{sp.high * 1000:.3g})"


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


def resolve_peak(plan: Plan, progress: Progress) -> Peak | None:
    """The run's peak memory bandwidth: the plan's number or datasheet entry, or measured
    on this machine by a copy benchmark (`peak_bandwidth: measure`)."""
    spec = plan.peak_bandwidth
    if spec is None:
        return None
    if spec.bytes_per_second is not None:
        return Peak(spec.bytes_per_second, f"from {spec.source}")
    progress.status("measuring this machine's memory bandwidth")
    peak = measure_peak()
    progress.note(f"▸ peak memory bandwidth {peak.bytes_per_second / 1e9:.1f} GB/s, {peak.source}")
    return peak


def run_lab(plan: Plan, lab: Lab) -> LabResults:
    """Run the plan; whatever happens, restore the backend before returning or raising.

    `restoring` (shared with the Kubernetes backend's tests) turns SIGTERM into
    `Terminated` and ignores further Ctrl-C / SIGTERM while `restore()` runs.
    """
    with restoring(lab.backend):
        return lab.run(plan)


__all__ = ["STOPPED", "Completion", "Lab", "LabError", "Terminated", "run_lab"]
