"""`folio up` for real with a replica larger than one pod: a manifest whose engine needs two pods' GPUs
(pipeline parallel 2, one GPU a pod) runs each replica as a group of two `folio serve` processes (the
leader and a `--headless` node, wired by LeaderWorkerSet's environment on loopback; on this machine's CPU),
and the router's answers are one process's."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from folio.engine import LLM, SamplingParams
from folio.engine.digest import compute_digest
from folio.operator.local.supervisor import free_port
from folio.operator.testing.up import UpProcess, write_manifest

pytestmark = pytest.mark.slow


def test_a_replica_of_two_pods_runs_as_a_group_and_answers_as_one_process(tmp_path: Path, tiny_llama: Path) -> None:
    manifest = write_manifest(tmp_path / "pp.yaml", name="tiny", model=tiny_llama, digest=compute_digest(tiny_llama),
                              args={"device": "cpu", "dtype": "float32", "maxModelLen": 256, "kvCacheMemoryGib": 0.02,
                                    "pipelineParallelSize": 2})  # fmt: skip
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"]["engine"]["resources"] = {"limits": {"nvidia.com/gpu": 1}}  # a stage per pod: groups of two
    manifest.write_text(yaml.safe_dump(doc))
    with LLM(str(tiny_llama), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.02) as llm:
        want = llm.generate(["Paris is"], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]

    up = UpProcess(manifest, port=free_port(), state_dir=tmp_path / ".folio", log=tmp_path / "up.log")
    try:
        up.wait_for(lambda s: s["status"].get("phase") == "Ready", 120, "the group serving")
        engines = [p.cmdline() for p in psutil.Process(up.proc.pid).children(recursive=True)
                   if "serve" in p.cmdline() and "--model" in p.cmdline()]  # fmt: skip
        assert sum("--headless" in cmd for cmd in engines) == 1 and len(engines) == 2, engines
        body = {"model": "tiny", "prompt": "Paris is", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        reply = httpx.post(f"{up.router_url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == want.outputs[0].text
    finally:
        up.stop()
