#!/usr/bin/env bash
# End-to-end on a throwaway kind cluster:
#   1. create the cluster (or reuse FOLIO_E2E_CLUSTER if it exists),
#   2. build the CPU image and load it onto the nodes,
#   3. run e2e/ with pytest, which installs the chart, seeds a PVC with SmolLM2, applies an
#      InferenceService, waits with `kubectl wait --for=condition=Ready`, rolls a faulty canary back,
#      promotes a healthy one (asserting status and router metrics) and runs `helm test`,
#   4. delete the cluster (unless FOLIO_E2E_KEEP=1 or it existed before).
# Needs docker and kind; helm and kubectl come from `make tools`. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${FOLIO_E2E_CLUSTER:-folio-e2e}
export FOLIO_E2E_IMAGE=${FOLIO_E2E_IMAGE:-folio:e2e}
KEEP=${FOLIO_E2E_KEEP:-0}

for tool in docker kind; do
  command -v "$tool" >/dev/null || { echo "e2e/run.sh needs $tool on PATH" >&2; exit 2; }
done
make install tools
export PATH="$PWD/.venv/tools/bin:$PATH"

created=0
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "--- creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 180s
  created=1
fi
# A kubeconfig of its own: the user's current context is left alone.
KUBECONFIG=$(mktemp)
export KUBECONFIG
cleanup() {
  if [[ "$KEEP" != 1 && "$created" == 1 ]]; then
    echo "--- deleting kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER"
  fi
  rm -f "$KUBECONFIG"
}
trap cleanup EXIT
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"

echo "--- building $FOLIO_E2E_IMAGE (CPU variant) and loading it into $CLUSTER"
docker build --build-arg VARIANT=cpu -t "$FOLIO_E2E_IMAGE" .
kind load docker-image "$FOLIO_E2E_IMAGE" --name "$CLUSTER"

echo "--- running the end-to-end scenarios"
FOLIO_E2E=1 .venv/bin/python -m pytest e2e -v -p no:cacheprovider "$@"
