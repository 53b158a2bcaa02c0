"""Every input of the public corpus (tests/fixtures/corpus/corpus.yaml) read by glassbox:
each value equals the one worked out by hand from the input."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from vllm_glassbox.core import derive
from vllm_glassbox.core.cold_start import read_cold_starts
from vllm_glassbox.core.layout import resolve_layout
from vllm_glassbox.core.snapshot import ENGINE_STEPS, read_snapshot
from vllm_glassbox.core.startup_log import read_facts
from vllm_glassbox.core.units import GIB
from vllm_glassbox.core.weights import resolve_weights

from tests.fixtures import FIXTURES

CORPUS = FIXTURES / "corpus"
ENTRIES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "corpus.yaml").read_text())
LOG_KEYS = {
    "version", "layout", "dtype", "weights_gib", "kv_tokens", "kv_blocks", "max_model_len",
    "max_concurrency", "stages", "model_name", "startups", "engines", "hybrid_kv",
    "unrecognised",
}  # fmt: skip
PAGE_KEYS = {
    "page_engines", "capacity_tokens", "capacity_with_logged_tokens", "engine_steps",
    "unrecognised",
}  # fmt: skip


def read_log(text: str) -> dict[str, Any]:
    """What glassbox reads from a log, in the manifest's terms."""
    facts = read_facts(text)
    layout = resolve_layout(facts)
    weights = resolve_weights(None, facts, None, layout)
    starts = read_cold_starts(text)
    cold = starts[-1] if starts else None
    stages = derive.startup_stages(cold) if cold else None
    return {
        "version": facts.vllm_version,
        "layout": [layout.tensor, layout.pipeline, layout.data],
        "dtype": facts.model_dtype,
        "weights_gib": weights.bytes / GIB if weights else None,
        "kv_tokens": facts.kv_cache_tokens,
        "kv_blocks": facts.kv_cache_blocks,
        "max_model_len": facts.max_model_len,
        "max_concurrency": facts.max_concurrency,
        "stages": {
            name: getattr(stages, name) if stages else None
            for name in (*derive.STARTUP_STAGES, "total")
        },
        "model_name": cold.model_name if cold else None,
        "startups": facts.startups,
        "engines": len(facts.engines_seen),
        "hybrid_kv": facts.hybrid_kv,
        "unrecognised": sorted(facts.unrecognised()),
    }


def read_page(text: str) -> dict[str, Any]:
    """What glassbox reads from a page, for its first engine, in the manifest's terms."""
    snapshot = read_snapshot(text)
    key = next(iter(snapshot.engines))
    cache = snapshot.cache_for(key)
    return {
        "page_engines": len(snapshot.engines),
        "capacity_tokens": derive.kv_cache_capacity_tokens(cache),
        "capacity_with_logged_tokens": derive.kv_cache_capacity_tokens(cache, 800_000),
        "engine_steps": ENGINE_STEPS in snapshot.engines[key].counters,
        "unrecognised": sorted(snapshot.unrecognised),
    }


def _same(read: Any, expected: Any) -> bool:
    if isinstance(expected, float) and isinstance(read, (int, float)):
        return read == pytest.approx(expected, abs=5e-5, rel=1e-6)
    return bool(read == expected)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_every_corpus_value_equals_the_hand_worked_one(entry: dict[str, Any]) -> None:
    text = (CORPUS / entry["file"]).read_text()
    is_page = entry["file"].endswith(".txt")
    read = read_page(text) if is_page else read_log(text)
    expected = entry["expected"]
    assert expected and set(expected) <= (PAGE_KEYS if is_page else LOG_KEYS)
    wrong = {}
    for key, value in expected.items():
        if key == "stages":
            for stage, seconds in value.items():
                if not _same(read["stages"][stage], seconds):
                    wrong[f"stages.{stage}"] = (read["stages"][stage], seconds)
        elif not _same(read[key], value):
            wrong[key] = (read[key], value)
    assert wrong == {}, f"{entry['file']} (read, expected): {wrong}"


def test_the_corpus_is_every_file_and_each_names_its_source() -> None:
    listed = {e["file"] for e in ENTRIES}
    on_disk = {p.name for p in CORPUS.iterdir() if p.suffix in (".log", ".txt")}
    assert listed == on_disk
    public = [e for e in ENTRIES if not e["file"].startswith("handwritten-")]
    assert len(public) >= 20
    assert all(e["source"] and e["version"] and e["launcher"] for e in ENTRIES)
    handwritten = [e for e in ENTRIES if e["file"].startswith("handwritten-")]
    assert all("hand-written" in e["source"] for e in handwritten)
