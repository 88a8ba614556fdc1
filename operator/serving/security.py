"""Pod Security "restricted" for every pod the operator creates (engine, router, pre-pull).

Each pod runs as the image's fixed non-root user (65532, see the Dockerfile) with the runtime's
default seccomp profile, no privilege escalation, no capabilities and a read-only root filesystem.
What the processes write goes to an emptyDir at /tmp, and every cache they know of (Hugging Face,
Triton, torch-inductor, XDG) is pointed there by its environment variable. `fsGroup` makes the
weights cache PVC writable by that user for the pre-pull Job (and readable by the engines).
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

USER_ID = 65532  # the Folio image's `folio` user and group
SCRATCH_DIR = "/tmp"
SCRATCH_VOLUME = "tmp"

# Where each process may write, under the scratch volume: HOME, and each library's cache.
SCRATCH_ENV: dict[str, str] = {
    "HOME": SCRATCH_DIR,
    "XDG_CACHE_HOME": f"{SCRATCH_DIR}/.cache",
    "HF_HOME": f"{SCRATCH_DIR}/huggingface",
    "TRITON_CACHE_DIR": f"{SCRATCH_DIR}/triton",
    "TORCHINDUCTOR_CACHE_DIR": f"{SCRATCH_DIR}/torchinductor",
}


def pod_security_context() -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": USER_ID,
        "runAsGroup": USER_ID,
        "fsGroup": USER_ID,
        # Chown a large weights volume only when its root does not match already, not on every start.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def scratch_volume(size: str) -> Obj:
    return {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": size}}


def scratch_mount() -> Obj:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}


def scratch_env(user_env: list[Obj] | None = None) -> list[Obj]:
    """The cache variables, then ``user_env``; a variable the user sets wins over ours."""
    user_env = list(user_env or [])
    theirs = {e.get("name") for e in user_env}
    return [{"name": k, "value": v} for k, v in SCRATCH_ENV.items() if k not in theirs] + user_env


def harden(pod_spec: Obj, *, scratch_size: str, api_token: bool) -> Obj:
    """Make ``pod_spec`` (with its containers) pass "restricted"; writable /tmp of ``scratch_size``.

    ``api_token``: whether the pod calls the Kubernetes API (only then is its token mounted).
    """
    pod_spec["automountServiceAccountToken"] = api_token
    pod_spec["securityContext"] = pod_security_context()
    pod_spec.setdefault("volumes", []).append(scratch_volume(scratch_size))
    for container in pod_spec["containers"]:
        container["securityContext"] = container_security_context()
        container.setdefault("volumeMounts", []).append(scratch_mount())
        container["env"] = scratch_env(container.get("env"))
    return pod_spec
