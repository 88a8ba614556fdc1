"""Every pod the operator creates passes Pod Security "restricted", and mounts its API token only where used."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from folio.operator.serving.security import SCRATCH_ENV
from tests.serving.helpers import make_spec, objects_by_key, revision
from tests.support.pss import hardening_gaps, pod_specs, violations


def _pods(**spec_overrides: object) -> dict[tuple[str, str], dict]:
    spec = make_spec(**spec_overrides)
    objs = objects_by_key(spec, revision(spec, weights_ready=False))
    return {k: o for k, o in objs.items() if pod_specs(o)}


@pytest.mark.parametrize("source", ["hf", "pvc"])
def test_every_planned_pod_is_restricted(source: str) -> None:
    overrides = {} if source == "hf" else {"model": {"source": "pvc://models/smol", "digest": "sha256:" + "ab" * 32}}
    pods = _pods(**overrides)
    assert {kind for kind, _ in pods} == {"Deployment", "Job"} and len(pods) == 3  # engine, router, pre-pull
    for key, obj in pods.items():
        kubernetes_validate.validate(obj, "1.30", strict=True)
        for pod in pod_specs(obj):
            assert violations(pod) == [], key
            assert hardening_gaps(pod) == [], key


def test_tokens_are_mounted_only_where_the_api_is_called() -> None:
    tokens = {name: pod_specs(obj)[0]["automountServiceAccountToken"] for (_, name), obj in _pods().items()}
    assert tokens == {"chat": True, **{n: False for n in tokens if n != "chat"}}  # the router watches the API
    (router,) = [o for (_, n), o in _pods().items() if n == "chat"]
    assert pod_specs(router)[0]["serviceAccountName"] == "chat-router"


def test_engine_caches_point_at_the_scratch_volume_and_user_env_wins() -> None:
    env = [{"name": "HF_HOME", "value": "/tmp/mine"}, {"name": "LOG_LEVEL", "value": "debug"}]
    pods = _pods(engine={"image": "img:1", "env": env})
    (engine,) = [o for (_, n), o in pods.items() if o["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    container = pod_specs(engine)[0]["containers"][0]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names))
    values = {e["name"]: e["value"] for e in container["env"]}
    assert values == {**SCRATCH_ENV, "HF_HOME": "/tmp/mine", "LOG_LEVEL": "debug"}
    # the weights stay read-only; fsGroup lets the pre-pull Job write the cache as the same user
    assert {"name": "weights", "mountPath": "/weights", "readOnly": True} in container["volumeMounts"]
    assert pod_specs(engine)[0]["securityContext"]["fsGroup"] == 65532


BAD: list[tuple[str, dict]] = [
    ("Privilege Escalation", {"containers": [{"securityContext": {"allowPrivilegeEscalation": True}}]}),
    ("Running as Non-root", {"containers": [{"securityContext": {"runAsNonRoot": False}}]}),
    ("Running as Non-root user", {"containers": [{"securityContext": {"runAsUser": 0}}]}),
    ("Seccomp", {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
    ("Capabilities", {"containers": [{"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}]}),
    ("Capabilities", {"containers": [{"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}}]}),
    ("Privileged Containers", {"containers": [{"securityContext": {"privileged": True}}]}),
    ("Host Namespaces", {"hostNetwork": True}),
    ("Host Ports", {"containers": [{"ports": [{"containerPort": 80, "hostPort": 80}]}]}),
    ("HostPath Volumes", {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}),
    ("Volume Types", {"volumes": [{"name": "n", "nfs": {"server": "x", "path": "/"}}]}),
    ("Sysctls", {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
]


def _merge(base: dict, change: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in change.items():
        if k == "containers":
            for c, cv in zip(out["containers"], v, strict=False):
                for ck, cvv in cv.items():
                    c[ck] = {**c.get(ck, {}), **cvv} if isinstance(cvv, dict) else cvv
        elif isinstance(v, dict):
            out[k] = {**out.get(k, {}), **v}
        else:
            out[k] = v
    return out


@pytest.mark.parametrize(("control", "change"), BAD, ids=[f"{c}-{i}" for i, (c, _) in enumerate(BAD)])
def test_the_checker_refuses_each_control(control: str, change: dict) -> None:
    (engine,) = [o for o in _pods().values() if o["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    good = pod_specs(engine)[0]
    assert violations(good) == []
    found = violations(_merge(good, change))
    assert any(v.startswith(control + ":") for v in found), found


def test_hardening_gaps_catch_a_writable_root_and_a_cache_off_volume() -> None:
    (engine,) = [o for o in _pods().values() if o["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    pod = copy.deepcopy(pod_specs(engine)[0])
    pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    pod["containers"][0]["env"].append({"name": "TRITON_CACHE_DIR", "value": "/root/.triton"})
    gaps = hardening_gaps(pod)
    assert any("readOnlyRootFilesystem" in g for g in gaps) and any("TRITON_CACHE_DIR" in g for g in gaps)
