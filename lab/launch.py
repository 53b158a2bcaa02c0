"""A whole run, as `glassbox lab run` and `glassbox demo` make it.

The run's peak memory bandwidth first (the plan's, or measured here), then the plan
against the backend with the observers watching each segment and, when asked, the
exporter beside each server (`sidecar.py`); report.md, results.json and the plots after
every phase; at the end, the dashboards drawn from a Prometheus that scraped the run.
The commands keep what differs between them: how the backend is made, which observers
and ports, what an interrupt prints.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from vllm_glassbox.lab.backends.backend import Backend
from vllm_glassbox.lab.membench import measure_peak
from vllm_glassbox.lab.plan import Plan
from vllm_glassbox.lab.progress import Progress
from vllm_glassbox.lab.report import dashboard_images, write_outputs
from vllm_glassbox.lab.results import LabResults, Peak
from vllm_glassbox.lab.runner import Lab, run_lab
from vllm_glassbox.lab.sidecar import ExporterBeside
from vllm_glassbox.lab.telemetry import Observer
from vllm_glassbox.lab.vllm.credentials import ApiKey


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


def run_plan(
    plan: Plan,
    backend: Backend,
    progress: Progress,
    out: Path,
    *,
    observers: Sequence[Observer] = (),
    notes: Sequence[str] = (),
    exporter_port: int | None = None,
    api_key: ApiKey | None = None,
    prometheus_url: str | None = None,
) -> LabResults:
    """Run the plan and write its outputs into `out` after every phase.

    `notes` open the report; `exporter_port`: an exporter beside each server on that port,
    its series kept in the results; `prometheus_url`: the dashboards over the run drawn
    into the report at the end. The backend is restored whatever happens (`run_lab`);
    an interrupt propagates after the partial report is written.
    """
    peak = resolve_peak(plan, progress)
    watching = list(observers)
    exporter = None
    if exporter_port is not None:
        exporter = ExporterBeside(
            exporter_port,
            peak.bytes_per_second if peak else None,
            bearer_token_file=api_key.file if api_key else None,
        )
        watching.append(exporter)
    lab = Lab(
        backend,
        progress,
        watching,
        publish=lambda results: write_outputs(results, out),
        peak=peak,
        api_key=api_key,
        out_dir=out,
        notes=tuple(notes),
    )
    try:
        results = run_lab(plan, lab)
    finally:
        if exporter is not None:
            exporter.close()
    if prometheus_url:
        progress.status("drawing the dashboards")
        images, empty, problem = dashboard_images(
            prometheus_url, out, results.started_at, results.ended_at or time.time()
        )
        results.images.update(images)
        results.empty_panels.update(empty)
        results.notes.extend([problem] if problem else [])
        write_outputs(results, out)
    return results
