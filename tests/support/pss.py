"""A Pod Security Standards "restricted" checker (Kubernetes v1.30 rules), field by field.

Follows https://kubernetes.io/docs/concepts/security/pod-security-standards/: every "baseline"
control, then the "restricted" ones. `violations(pod_spec)` lists what a namespace enforcing
`pod-security.kubernetes.io/enforce: restricted` would refuse; empty means admitted.
`pod_specs(obj)` finds the pod template of a Pod, Deployment, Job (etc.).
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

# Baseline "Sysctls": the safe set.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
# Baseline "SELinux": allowed types.
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Restricted "Volume Types".
VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                "secret"}
# Restricted "Seccomp".
SECCOMP_TYPES = {"RuntimeDefault", "Localhost"}
# Where the processes in Folio's image write (HOME and library caches): each must be on a volume.
CACHE_VARIABLES = {"HOME", "XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"}


def pod_specs(obj: Obj) -> list[Obj]:
    """The pod spec(s) an object makes: Pod itself, or the template of a workload."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "Pod":
        return [spec]
    if kind == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    if kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
        return [spec["template"]["spec"]]
    return []


def _containers(pod: Obj) -> list[Obj]:
    return [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]


def violations(pod: Obj) -> list[str]:
    out: list[str] = []
    psc: Obj = pod.get("securityContext") or {}
    containers = _containers(pod)
    if not containers:
        out.append("no containers")

    # ---- baseline
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(f"Host Namespaces: {field}")
    contexts = [("pod", psc)] + [(c["name"], c.get("securityContext") or {}) for c in containers]
    for where, sc in contexts:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"HostProcess: {where}")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            out.append(f"SELinux: {where}")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"AppArmor: {where}")
    for c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"Privileged Containers: {c['name']}")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                out.append(f"Host Ports: {c['name']}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"/proc Mount Type: {c['name']}")
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            out.append(f"HostPath Volumes: {volume['name']}")
    for sysctl in psc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            out.append(f"Sysctls: {sysctl['name']}")
    for key, value in (pod.get("metadata", {}).get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            out.append(f"AppArmor: {key}")

    # ---- restricted
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUME_TYPES:
            out.append(f"Volume Types: {volume['name']} is {sorted(kinds)}")
    pod_non_root = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_TYPES:
        out.append(f"Seccomp: pod is {pod_seccomp}")
    if psc.get("runAsUser") == 0:
        out.append("Running as Non-root user: pod runAsUser 0")
    for c in containers:
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"Privilege Escalation: {name}")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            out.append(f"Running as Non-root: {name}")
        if sc.get("runAsUser") == 0:
            out.append(f"Running as Non-root user: {name}")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if (seccomp or pod_seccomp) not in SECCOMP_TYPES:
            out.append(f"Seccomp: {name} is {seccomp or pod_seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            out.append(f"Capabilities: {name} does not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"Capabilities: {name} adds {sorted(set(caps['add']) - {'NET_BIND_SERVICE'})}")
    return out


def hardening_gaps(pod: Obj) -> list[str]:
    """Beyond "restricted", what Folio asks of its pods: a read-only root and every write on a volume."""
    out = []
    mounts_by_container = {c["name"]: {m["mountPath"] for m in c.get("volumeMounts", [])} for c in _containers(pod)}
    for c in _containers(pod):
        if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
            out.append(f"readOnlyRootFilesystem: {c['name']}")
        mounts = mounts_by_container[c["name"]]
        for env in c.get("env", []):
            value = env.get("value") or ""
            on_volume = any(value == m or value.startswith(m.rstrip("/") + "/") for m in mounts)
            if env["name"] in CACHE_VARIABLES and not on_volume:
                out.append(f"{env['name']}={value} of {c['name']} is not on a mounted volume")
        if "/tmp" not in mounts:
            out.append(f"no writable /tmp in {c['name']}")
    return out
