"""The Dockerfile, read by a small parser (no container engine here): the properties the chart relies on."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import yaml

from tests.chart import helm as h

DOCKERFILE = (h.REPO / "Dockerfile").read_text()


@dataclass
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    body: list[Instruction]


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions, with line continuations joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, args = line.strip().partition(" ")
            out.append(Instruction(keyword.upper(), " ".join(args.split())))
    return out


def stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    found: list[Stage] = []
    for ins in instructions(text):
        if ins.keyword == "FROM":
            parts = ins.args.split()
            found.append(Stage(parts[0], parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None, []))
        elif not found and ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            global_args[name] = default
        else:
            found[-1].body.append(ins)
    return global_args, found


ARGS, STAGES = stages(DOCKERFILE)
FINAL = STAGES[-1]


def _last(stage: Stage, keyword: str) -> str:
    return [i.args for i in stage.body if i.keyword == keyword][-1]


def test_variants_cuda_by_default_and_cpu_by_build_arg() -> None:
    assert ARGS["VARIANT"] == "cuda"
    by_name = {s.name: s for s in STAGES}
    assert by_name["base-cuda"].base == "${CUDA_BASE}" and ARGS["CUDA_BASE"].startswith("nvidia/cuda:")
    assert by_name["base-cpu"].base.startswith("python:") and by_name["base-cpu"].base.endswith("-slim")
    assert by_name["base"].base == "base-${VARIANT}"
    assert "download.pytorch.org/whl/cpu" in _last(by_name["base-cpu"], "ENV")


def test_multi_stage_and_runtime_only_copies_the_venv() -> None:
    assert [s.name for s in STAGES][-2:] == ["build", "runtime"]
    assert FINAL.base == "base"
    copies = [i.args for i in FINAL.body if i.keyword == "COPY"]
    assert copies == ["--from=build /opt/folio /opt/folio"]  # no sources, no build tools, no weights


def test_torch_pin_matches_the_makefile() -> None:
    make_pin = re.search(r"^TORCH \?= torch==(\S+)$", (h.REPO / "Makefile").read_text(), re.M)
    assert make_pin and ARGS["TORCH_VERSION"] == make_pin.group(1)


def test_non_root_user_matches_the_chart() -> None:
    values = yaml.safe_load((h.CHART / "values.yaml").read_text())
    uid, gid = _last(FINAL, "USER").split(":")
    assert int(uid) != 0 and int(uid) == values["operator"]["podSecurityContext"]["runAsUser"]
    assert int(gid) == values["operator"]["podSecurityContext"]["runAsGroup"]
    env = " ".join(i.args for i in FINAL.body if i.keyword == "ENV")
    assert "HOME=/tmp" in env  # the only writable place under the chart's read-only root filesystem


def test_entrypoint_is_the_folio_console_script() -> None:
    assert _last(FINAL, "ENTRYPOINT") == '["folio"]'
    pyproject = (h.REPO / "pyproject.toml").read_text()
    assert re.search(r'^folio = "folio\.operator\.cli:main"$', pyproject, re.M)


def test_build_copies_every_package_and_dockerignore_lets_them_through() -> None:
    build = next(s for s in STAGES if s.name == "build")
    sources = {src for i in build.body if i.keyword == "COPY" for src in shlex.split(i.args)[:-1]}
    assert {"operator", "engine", "kernels", "pyproject.toml", "setup.py", "README.md"} <= sources
    ignore = [line for line in (h.REPO / ".dockerignore").read_text().splitlines()
              if line and not line.startswith("#")]
    assert ignore[0] == "**"  # allow-list: nothing (weights, .venv, .git) enters the context by accident
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert sources <= allowed
    assert not any(re.search(r"\.(gguf|safetensors|bin|pt)\b", i.args) for s in STAGES for i in s.body)
