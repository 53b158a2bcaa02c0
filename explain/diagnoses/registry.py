"""The diagnoses in their order, and `explain()`: every one of them over a scene, what
they found linked and ordered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from vllm_glassbox.explain.diagnoses import (
    adapters,
    cold_start,
    decode,
    disaggregation,
    glassbox,
    idle,
    kv_pool,
    slo,
    speculation,
)
from vllm_glassbox.explain.diagnoses.common import Diagnosis, untrusted
from vllm_glassbox.explain.findings import Explained, Finding, ordered
from vllm_glassbox.explain.scene import Scene

#: Every diagnosis, in the order their findings show within one severity: an objective
#: missed first, then the mechanisms that usually explain it. Those whose inputs vLLM can
#: write in shapes glassbox does not read are guarded by their module's `UNTRUSTED`.
DIAGNOSES: tuple[Diagnosis, ...] = (
    glassbox.glassbox,
    idle.idle,
    slo.slo,
    untrusted(kv_pool.kv_pool, kv_pool.UNTRUSTED),
    untrusted(speculation.speculation, speculation.UNTRUSTED),
    untrusted(decode.decode, decode.UNTRUSTED),
    untrusted(disaggregation.disaggregation, disaggregation.UNTRUSTED),
    adapters.adapters,
    cold_start.cold_start,
)


def explain(scene: Scene, diagnoses: Sequence[Diagnosis] = DIAGNOSES) -> Explained:
    """Every diagnosis of one scene, most severe first."""
    found: list[Finding] = []
    for diagnosis in diagnoses:
        found.extend(diagnosis(scene))
    return Explained(scene.scope, ordered(linked(found)))


def linked(found: Sequence[Finding]) -> list[Finding]:
    """Each finding's `see` kept to the findings that are there (and not `ok`); one that
    names some, none of which is there, says so."""
    there = {f.key for f in found if f.severity != "ok"}
    out = []
    for f in found:
        if f.see:
            see = tuple(k for k in f.see if k in there)
            nothing = (
                "what is behind it: none of the findings that usually explain it (the KV pool, "
                "decode, speculation) is here; the runbook's section lists where else to look"
            )
            f = replace(f, see=see, unseen=f.unseen if see else (*f.unseen, nothing))
        out.append(f)
    return out
