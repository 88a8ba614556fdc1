#!/usr/bin/env bash
# The one prepared GPU check for folio's kernels and engine, in one run of under 8 minutes, most informative
# section first, each under its own timeout: the decode-attention benchmark (against torch SDPA, flash-attn
# when importable, and the kernel called as the engine's CUDA graphs call it), the kernel tests compiled for
# the GPU (gpu-marked ones at full size), the engine's GPU tests (CUDA graphs vs eager, CUDA vs CPU), then the
# prefill and engine benchmarks (random-weight Llama-3-8B / Qwen2.5-7B geometries built on the machine, against
# transformers generate), and with two or more GPUs TP=2 against TP=1 (bench/tp.py). It installs nothing and needs only torch (CUDA), triton, transformers, numpy, pytest
# and safetensors: no pydantic, fastapi, kopf or gguf (PY=/path/to/python to choose the Python).
# With $OUT set, the log is $OUT/gpu_check.log and the figures $OUT/gpu_check.json.
#
#   bench/gpu_check.sh [--dry-run]   # --dry-run: collect the tests and run the benchmarks' imports tiny on CPU
set -uo pipefail
cd "$(dirname "$0")/.."
dry_run=0
[[ "${1:-}" == "--dry-run" ]] && dry_run=1

out=${OUT:-}
if [[ -n "$out" ]]; then
  mkdir -p "$out"
  exec > >(tee -a "$out/gpu_check.log") 2>&1
fi

usable() {
  if ((dry_run)); then "$1" -c 'import torch, triton, pytest, transformers' 2>/dev/null
  else "$1" -c 'import torch, triton, pytest; assert torch.cuda.is_available()' 2>/dev/null; fi
}
if [[ -z "${PY:-}" ]]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null && usable "$candidate"; then PY=$candidate; break; fi
  done
fi
if [[ -z "${PY:-}" ]] || ! usable "$PY"; then
  echo "gpu_check: no Python with CUDA torch, triton and pytest found (set PY=...)" >&2
  exit 2
fi

# folio maps folders to packages (kernels/ -> folio.kernels; engine/api.py is folio/engine/__init__.py, see
# setup.py). Without an install, expose them through a throwaway folder of links rather than installing anything.
if ! "$PY" -c 'from folio.engine import LLM; import folio.kernels.decode_attention' 2>/dev/null; then
  shim=$(mktemp -d)
  trap 'rm -rf "$shim"' EXIT
  mkdir -p "$shim/folio/engine"
  for pkg in kernels operator; do ln -s "$PWD/$pkg" "$shim/folio/$pkg"; done
  for f in "$PWD"/engine/*; do ln -s "$f" "$shim/folio/engine/"; done
  ln -s "$PWD/engine/api.py" "$shim/folio/engine/__init__.py"
  export PYTHONPATH="$shim:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

status=0
failed=()
section() {  # section NAME SECONDS COMMAND...: run one section under its timeout, note a failure, go on
  local name=$1 limit=$2
  shift 2
  echo "== $name (timeout ${limit}s)"
  local start=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - start)) s"
  if ((rc != 0)); then status=1; failed+=("$name"); fi
}
pytest_args=(-q -rs -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestConfigWarning)
json_dir=${out:-$(mktemp -d)}

if ((dry_run)); then
  section "collect kernel and engine GPU tests" 120 "$PY" -m pytest --collect-only "${pytest_args[@]}" \
    tests/kernels tests/engine/test_gpu.py
  section "benchmarks, tiny on CPU" 120 "$PY" bench/gpu_kernels.py --dry-run
  section "tensor parallel benchmark, tiny on CPU" 120 "$PY" bench/tp.py --dry-run
  ((status == 0)) && echo "gpu_check --dry-run: ok" || echo "gpu_check --dry-run: failed: ${failed[*]}"
  exit $status
fi

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv,noheader 2>/dev/null || true
"$PY" -c 'import torch, triton; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, {torch.cuda.get_device_name()}")'

section "decode attention benchmark" 90 "$PY" bench/gpu_kernels.py --section decode --json "$json_dir/decode.json"
section "kernel tests on the GPU" 120 "$PY" -m pytest "${pytest_args[@]}" tests/kernels \
  --ignore=tests/kernels/test_gpu_check_dry_run.py
section "engine tests on the GPU" 90 "$PY" -m pytest "${pytest_args[@]}" tests/engine/test_gpu.py
section "prefill attention benchmark" 30 "$PY" bench/gpu_kernels.py --section prefill --quick --json "$json_dir/prefill.json"
section "engine benchmark" 140 "$PY" bench/gpu_kernels.py --section engine --json "$json_dir/engine.json"
# two or more GPUs: TP=2 against TP=1 (bench/tp.py, a random ~1B Llama built here, bfloat16)
if (( $("$PY" -c 'import torch; print(torch.cuda.device_count())') >= 2 )); then
  section "tensor parallel benchmark" 180 "$PY" bench/tp.py --device cuda --json "$json_dir/tp.json"
else
  echo "== tensor parallel benchmark: skipped (one GPU)"
fi

"$PY" - "$json_dir" "${failed[@]}" <<'PY'
import json, sys
from pathlib import Path
folder, failed = Path(sys.argv[1]), sys.argv[2:]
figures = {"failed_sections": failed}
for part in ("decode", "prefill", "engine", "tp"):
    path = folder / f"{part}.json"
    if path.exists():
        figures.update(json.loads(path.read_text()))
(folder / "gpu_check.json").write_text(json.dumps(figures, indent=1))
print(f"figures: {folder / 'gpu_check.json'}")
PY
((status == 0)) && echo "gpu_check: ok" || echo "gpu_check: failed: ${failed[*]}"
exit $status
