"""The chart rendered by Helm's real engine (helm-python-sdk: Helm v4 as a library).

No helm binary and no API server here: `render()` is `helm template` with the cluster's
kube version and API versions given, as `.Capabilities` would report them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "vllm-glassbox"
CI_DIR = CHART / "ci"
# The oldest the chart supports, the first with native sidecars, a common one, the first
# with DRA's resource.k8s.io/v1.
KUBE_VERSIONS = ("1.25.0", "1.29.0", "1.30.0", "1.34.0")
MONITORING_APIS = (
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
HelmError = helm.HelmError


@dataclass(frozen=True)
class Rendered:
    manifests: list[dict[str, Any]]
    notes: str
    text: str  # every manifest, as Helm would store the release's manifest

    def kinds(self) -> list[str]:
        return sorted(m["kind"] for m in self.manifests)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [m for m in self.of_kind(kind) if name is None or m["metadata"]["name"] == name]
        assert len(found) == 1, f"{len(found)} {kind} named {name}: {self.kinds()}"
        return found[0]


def render(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str = "1.30.0",
    api_versions: tuple[str, ...] = MONITORING_APIS,
    name: str = "demo",
    namespace: str = "llm",
    chart_dir: Path = CHART,
) -> Rendered:
    # A packaged chart (`helm package`'s .tgz) or a chart's folder.
    chart = (
        helm.Chart.load_archive(chart_dir.read_bytes())
        if chart_dir.suffix == ".tgz"
        else helm.Chart.load(chart_dir)
    )
    options = {
        "name": name,
        "namespace": namespace,
        "kube_version": f"v{kube_version}",
        "api_versions": list(api_versions),
    }
    # The public render() does not pass kube and API versions; the native call does.
    out = _native.call_string(
        "helm_render", chart._raw(), json.dumps(values or {}), json.dumps(options)
    )
    files: dict[str, str] = json.loads(out)
    manifests: list[dict[str, Any]] = []
    texts = []
    notes = ""
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        texts.append(f"---\n# Source: {path}\n{text}")
        # libyaml's loader: the pure-Python one took nine tenths of a render.
        manifests += [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]
    return Rendered(manifests, notes, "\n".join(texts))


def ci_values() -> dict[str, tuple[dict[str, Any], str]]:
    """Each ci/*-values.yaml: its values and the oldest Kubernetes it needs (its
    `# kubeVersion: >=X` line, else the chart's 1.25)."""
    found = {}
    for path in sorted(CI_DIR.glob("*-values.yaml")):
        text = path.read_text()
        match = re.search(r"^# kubeVersion: >=(\d+\.\d+)", text, flags=re.M)
        found[path.name] = (
            yaml.safe_load(text) or {},
            f"{match.group(1)}.0" if match else "1.25.0",
        )
    return found


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def pod_specs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod spec of a Pod, or of a workload's pod template."""
    if manifest["kind"] == "Pod":
        return [manifest["spec"]]
    template = manifest.get("spec", {}).get("template", {})
    return (
        [template["spec"]]
        if "spec" in template and manifest["kind"] != "ResourceClaimTemplate"
        else []
    )


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def container_named(spec: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [c for c in containers(spec) if c["name"] == name]
    return found


def check_core_objects(manifests: list[dict[str, Any]], kube: str) -> None:
    """Every object but the operator's against Kubernetes' schema for `kube`, strictly:
    raises on an unknown field, a wrong type or a kind this version lacks."""
    import kubernetes_validate

    for manifest in manifests:
        if manifest["kind"] not in OPERATOR_KINDS:
            kubernetes_validate.validate(manifest, kube, strict=True)


def check_operator_objects(manifests: list[dict[str, Any]]) -> None:
    """The ServiceMonitors, PodMonitors and PrometheusRules read back by the operator's
    typed models with no field lost (the models ignore unknown keys)."""
    # Imported here: the models take seconds to import, which only their tests should pay.
    from cloudcoil.models.prometheus_operator import v1 as monitoring

    models = {
        "ServiceMonitor": monitoring.ServiceMonitor,
        "PodMonitor": monitoring.PodMonitor,
        "PrometheusRule": monitoring.PrometheusRule,
    }
    for manifest in (m for m in manifests if m["kind"] in OPERATOR_KINDS):
        model = models[manifest["kind"]].model_validate(manifest)
        back = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
        assert back["spec"] == manifest["spec"], manifest["metadata"]["name"]
