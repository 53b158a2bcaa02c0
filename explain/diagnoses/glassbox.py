"""glassbox itself: what it could not read (a failed poll, failed scrapes, a shape of
vLLM's output it does not know), said before everything else."""

from __future__ import annotations

from vllm_glassbox.explain.findings import Figure, Finding, Severity, say
from vllm_glassbox.explain.scene import Scene

#: Each blind spot: its severity, title, and its sentence with a count and without one
#: ({detail}: what shows it, in words; the count is a figure).
_BLIND_WORDS: dict[str, tuple[Severity, str, str, str]] = {
    "target_down": (
        "critical",
        "glassbox cannot read vLLM",
        "{count} exporters of this model cannot read their vLLM now ({detail}): every "
        "series they derive is absent",
        "the exporter's latest poll of vLLM failed ({detail}): every series it derives is absent",
    ),
    "scrape_failed": (
        "critical",
        "Prometheus cannot scrape part of this namespace",
        "Prometheus' latest scrape of {count} targets of {detail} failed (up == 0): their "
        "series are missing from everything below",
        "Prometheus' latest scrapes of {detail} failed (up == 0): their series are missing "
        "from everything below",
    ),
    "no_exporter": (
        "warning",
        "No glassbox exporter beside this model",
        "{detail}: the weights, the KV pool in tokens, bandwidth and cold starts are unknown",
        "{detail}: the weights, the KV pool in tokens, bandwidth and cold starts are unknown",
    ),
    "failed_polls": (
        "warning",
        "Some polls of vLLM failed",
        "{count} polls of vLLM failed in the window ({detail}): the windowed series span "
        "them, the gauges of those moments are lost",
        "polls of vLLM failed in the window ({detail}): the windowed series span them, the "
        "gauges of those moments are lost",
    ),
    "input_unrecognised": (
        "warning",
        "glassbox does not read part of vLLM's output",
        "{detail}: the series it would feed are absent, not guessed",
        "{detail}: the series it would feed are absent, not guessed",
    ),
}


def glassbox(scene: Scene) -> list[Finding]:
    """What glassbox could not read: a failed poll, failed scrapes, a shape of vLLM's log
    or page it does not know. These come before everything else."""
    out = []
    for blind in scene.blind:
        severity, title, counted_, uncounted = _BLIND_WORDS[blind.kind]
        # The detail is words (reasons, shapes, jobs): braces in it are no fields.
        detail = blind.detail.replace("{", "{{").replace("}", "}}")
        if blind.count is not None and "{count}" in counted_:
            count = Figure(blind.count, "count", "read", (blind.source,))
            what = say(counted_.replace("{detail}", detail), count=count)
        else:
            what = say(uncounted.replace("{detail}", detail))
        out.append(
            Finding(
                "glassbox", blind.kind, severity, title, what, unseen=(f"shown by {blind.source}",)
            )
        )
    return out
