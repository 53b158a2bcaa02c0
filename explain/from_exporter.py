"""An exporter's `/findings`: the document it answers (the findings of its scene, and the
scene itself) and the scenes read back over HTTP (`glassbox explain --exporter URL`).
The scene is built beside the poller (`exporter/scene.py`)."""

from __future__ import annotations

import json
from typing import Any

from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import TargetCredentials, fetch_once
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.render import explained_json
from vllm_glassbox.explain.scene import (
    Scene,
    scene_from_json,
    scene_to_json,
)

FINDINGS_PATH = "/findings"


def read_findings_page(
    base_url: str, timeout_seconds: float = 10.0, credentials: TargetCredentials | None = None
) -> list[Scene]:
    """The scenes an exporter's `/findings` holds; ScrapeError when it cannot be read or
    is not an exporter's findings."""
    text = fetch_once(base_url, FINDINGS_PATH, timeout_seconds, credentials)
    try:
        body = json.loads(text)
        return [scene_from_json(scene) for scene in body["scenes_observed"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ScrapeError(
            "parse", f"{base_url}{FINDINGS_PATH} is not a glassbox exporter's findings: {e}"
        ) from None


def findings_document(scene: Scene) -> dict[str, Any]:
    """What `/findings` answers: the findings of the exporter's scene, and the scene
    itself (`glassbox explain --exporter` diagnoses it again, with a lab run's baseline)."""
    return {
        "scenes": explained_json([explain(scene)]),
        "scenes_observed": [scene_to_json(scene)],
    }
