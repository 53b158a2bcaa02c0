"""The autoscaling example (docs/autoscaling.md): a KEDA ScaledObject on the KV headroom
rules, and the HorizontalPodAutoscaler KEDA makes of it.

No Kubernetes API server or KEDA runs here. The ScaledObject is checked against a schema
of the ScaledObject fields it uses, written from KEDA's ScaledObject and Prometheus-scaler
reference (keda.sh/v1alpha1; unknown fields rejected, so a typo fails); the HPA that KEDA
creates from it (autoscaling/v2, an External metric `s0-prometheus` selected by the
`scaledobject.keda.sh/name` label, the behaviour copied from `advanced`) is rendered here,
compared with the documented file, and validated against Kubernetes' own schemas
(kubernetes-validate, strict). The query runs on the real stack's Prometheus.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml

from tests.realstack import RealStack

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "autoscaling.md"
SCALED_OBJECT = REPO / "docs" / "autoscaling" / "keda-scaledobject.yaml"
HPA = REPO / "docs" / "autoscaling" / "keda-hpa.yaml"
RULES = REPO / "alerts" / "glassbox-rules.yaml"

_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
_DECIMAL = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"}
_BOOL_STRING = {"type": "string", "enum": ["true", "false"]}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": False,
    }


# The ScaledObject fields the example uses, with their documented types and rules.
SCALED_OBJECT_SCHEMA = _object(
    ["apiVersion", "kind", "metadata", "spec"],
    apiVersion={"const": "keda.sh/v1alpha1"},
    kind={"const": "ScaledObject"},
    metadata=_object(["name"], name=_NAME, namespace=_NAME),
    spec=_object(
        ["scaleTargetRef", "triggers"],
        scaleTargetRef=_object(
            ["name"], apiVersion={"type": "string"}, kind={"type": "string"}, name=_NAME
        ),
        minReplicaCount={"type": "integer", "minimum": 0},
        maxReplicaCount={"type": "integer", "minimum": 1},
        pollingInterval={"type": "integer", "minimum": 1},
        cooldownPeriod={"type": "integer", "minimum": 0},
        advanced=_object(
            [],
            horizontalPodAutoscalerConfig=_object(
                [],
                name=_NAME,
                # Copied into the HPA as it is: checked there by Kubernetes' schema.
                behavior={"type": "object"},
            ),
        ),
        triggers={
            "type": "array",
            "minItems": 1,
            "items": _object(
                ["type", "metadata"],
                type={"const": "prometheus"},
                metricType={"enum": ["AverageValue", "Value"]},
                metadata=_object(
                    ["serverAddress", "query", "threshold"],
                    serverAddress={"type": "string", "pattern": r"^https?://[^\s/]+(/\S*)?$"},
                    query={"type": "string", "minLength": 1},
                    threshold=_DECIMAL,
                    activationThreshold=_DECIMAL,
                    ignoreNullValues=_BOOL_STRING,
                ),
            ),
        },
    ),
)


def _scaled_object() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(SCALED_OBJECT.read_text())
    return loaded


def _milli_quantity(decimal: str) -> str:
    """A decimal as the Kubernetes quantity KEDA writes into the HPA ("0.8" -> "800m")."""
    milli = round(float(decimal) * 1000)
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def keda_hpa(scaled_object: dict[str, Any]) -> dict[str, Any]:
    """The HorizontalPodAutoscaler KEDA 2.x creates for a ScaledObject."""
    name = scaled_object["metadata"]["name"]
    spec = scaled_object["spec"]
    metrics = [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": f"s{i}-{trigger['type']}",
                    "selector": {"matchLabels": {"scaledobject.keda.sh/name": name}},
                },
                "target": {
                    "type": trigger.get("metricType", "AverageValue"),
                    (
                        "averageValue"
                        if trigger.get("metricType", "AverageValue") == "AverageValue"
                        else "value"
                    ): _milli_quantity(trigger["metadata"]["threshold"]),
                },
            },
        }
        for i, trigger in enumerate(spec["triggers"])
    ]
    hpa_config = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
    hpa_spec: dict[str, Any] = {
        "scaleTargetRef": {
            "apiVersion": spec["scaleTargetRef"].get("apiVersion", "apps/v1"),
            "kind": spec["scaleTargetRef"].get("kind", "Deployment"),
            "name": spec["scaleTargetRef"]["name"],
        },
        "minReplicas": spec.get("minReplicaCount", 0) or 1,  # KEDA itself handles 0
        "maxReplicas": spec.get("maxReplicaCount", 100),
        "metrics": metrics,
    }
    if "behavior" in hpa_config:
        hpa_spec["behavior"] = copy.deepcopy(hpa_config["behavior"])
    hpa_name = hpa_config.get("name", f"keda-hpa-{name}")
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": hpa_name,
            "namespace": scaled_object["metadata"]["namespace"],
            "labels": {
                "app.kubernetes.io/managed-by": "keda-operator",
                "app.kubernetes.io/name": hpa_name,
                "app.kubernetes.io/part-of": name,
                "scaledobject.keda.sh/name": name,
            },
        },
        "spec": hpa_spec,
    }


def _query() -> str:
    query: str = _scaled_object()["spec"]["triggers"][0]["metadata"]["query"]
    return query


def test_the_scaled_object_has_the_fields_and_types_keda_reads() -> None:
    jsonschema.validate(_scaled_object(), SCALED_OBJECT_SCHEMA)


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("spec", "triggers", 0, "metadata", "threshold"), 0.8, "not of type 'string'"),
        (("spec", "triggers", 0, "metadata", "treshold"), "0.8", "Additional properties"),
        (("spec", "triggers", 0, "metricType"), "Utilization", "is not one of"),
        (("spec", "scaleTargetRef", "name"), "vLLM_Qwen", "does not match"),
        (("spec", "minReplicaCount"), "1", "not of type 'integer'"),
    ],
)
def test_the_schema_check_catches_what_keda_would_reject(
    path: tuple[str | int, ...], value: object, problem: str
) -> None:
    broken = _scaled_object()
    node: Any = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError, match=problem):
        jsonschema.validate(broken, SCALED_OBJECT_SCHEMA)


def test_the_query_is_promql_on_the_recording_rule_and_selects_one_series() -> None:
    query = promql_parser.parse(_query())
    assert isinstance(query, promql_parser.VectorSelector)
    records = {
        rule["record"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    assert query.name in records
    # The rule keeps namespace and model_name: both matched, so KEDA gets one value.
    matched = {m.name for m in query.matchers.matchers}
    assert matched == {"namespace", "model_name"}


HPA_HEADER = """\
# The HorizontalPodAutoscaler KEDA creates from keda-scaledobject.yaml (rendered by
# tests/rules/test_autoscaling.py, which checks this file and validates it against the
# Kubernetes 1.30 schemas). KEDA owns it: do not apply it yourself.
"""


def test_the_hpa_keda_creates_is_the_documented_one_and_valid_kubernetes(
    update_golden: bool,
) -> None:
    rendered = keda_hpa(_scaled_object())
    if update_golden:
        HPA.write_text(HPA_HEADER + yaml.safe_dump(rendered, sort_keys=False))
    assert HPA.read_text() == HPA_HEADER + yaml.safe_dump(rendered, sort_keys=False), (
        "pytest --update-golden rewrites docs/autoscaling/keda-hpa.yaml"
    )
    kubernetes_validate.validate(rendered, "1.30.0", strict=True)
    target = rendered["spec"]["metrics"][0]["external"]["target"]
    assert target == {"type": "AverageValue", "averageValue": "800m"}


def test_a_bad_behaviour_fails_kubernetes_validation() -> None:
    broken = _scaled_object()
    behavior = broken["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    del behavior["scaleUp"]["policies"][0]["periodSeconds"]  # required by autoscaling/v2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(keda_hpa(broken), "1.30.0", strict=True)


def test_the_doc_shows_the_scaled_object_file_as_it_is_and_links_the_hpa() -> None:
    text = DOC.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    assert SCALED_OBJECT.read_text() in blocks
    assert "autoscaling/keda-hpa.yaml" in text


@pytest.mark.vllm
def test_on_the_real_stack_the_signal_asks_for_more_replicas_and_none_while_idle(
    stack: RealStack,
) -> None:
    """The trigger's query on the stack's Prometheus (no namespace outside Kubernetes),
    over the flood and the fill phase, which both fill the one replica's pool."""
    query = re.sub(r'namespace="[^"]*",\s*', "", _query()).replace('"qwen"', '"tiny"')
    threshold = float(_scaled_object()["spec"]["triggers"][0]["metadata"]["threshold"])
    t = stack.times
    idle = stack.query(query, at=t["spec_start"] - 1)
    assert idle == []  # nothing runs: KEDA reads 0 and keeps minReplicaCount
    busy = stack.query_range(query, t["flood_start"], t["fill_end"], step=1.0)
    assert len(busy) == 1
    needed = [float(v) for _, v in busy[0]["values"]]
    desired = max(math.ceil(v / threshold) for v in needed)
    print(
        f"\nreplicas needed while the pool filled: peak {max(needed):.2f} "
        f"(KEDA's desired replicas at threshold {threshold}: {desired})"
    )
    assert desired >= 2  # the pool ran past 80 %: one more replica
