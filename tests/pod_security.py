"""Pod Security Standards, "restricted" profile, as a pure check of one pod spec.

No API server runs here, so its PodSecurity admission cannot be asked; this is the
profile's rule list (kubernetes.io/docs/concepts/security/pod-security-standards,
baseline plus restricted, policy version 1.25 and later) written out, applied to the
rendered specs. It returns what admission would name, so a test can assert on it.
"""

from __future__ import annotations

from typing import Any

_ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
_SECCOMP_OK = {"RuntimeDefault", "Localhost"}


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """Every way `spec` (a PodSpec as a dict) breaks the restricted profile."""
    problems: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            problems.append(f"{field}: true")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= _ALLOWED_VOLUMES:
            problems.append(f"volume {volume['name']}: type {sorted(kinds)} not allowed")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl["name"] not in _SAFE_SYSCTLS:
            problems.append(f"sysctl {sysctl['name']} not allowed")
    if (pod_sc.get("seLinuxOptions") or {}).get("user") or (pod_sc.get("seLinuxOptions") or {}).get(
        "role"
    ):
        problems.append("pod seLinuxOptions user/role set")
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod runAsUser: 0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in _SECCOMP_OK:
        problems.append(f"pod seccompProfile {pod_seccomp}")
    all_containers = [
        *spec.get("initContainers", []),
        *spec.get("containers", []),
        *spec.get("ephemeralContainers", []),
    ]
    for c in all_containers:
        sc = c.get("securityContext") or {}
        where = f"container {c['name']}"
        if sc.get("privileged"):
            problems.append(f"{where}: privileged")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            problems.append(f"{where}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{where}: procMount {sc['procMount']}")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}: capabilities must drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {capabilities['add']}")
        if sc.get("runAsUser") == 0:
            problems.append(f"{where}: runAsUser 0")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"{where}: runAsNonRoot must be true (pod or container)")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in _SECCOMP_OK:
            problems.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
        if (sc.get("seLinuxOptions") or {}).get("user") or (sc.get("seLinuxOptions") or {}).get(
            "role"
        ):
            problems.append(f"{where}: seLinuxOptions user/role set")
    return problems
