#!/usr/bin/env bash
# make demo-cluster: the `make demo` story on the local control plane.
#
# Starts (or reuses) the local control plane of hack/cluster-up.sh, installs
# charts/dynamiccl with helm, runs the chart's operator and reward ingest as
# local processes (kwok runs no containers), applies a copy of the sample
# policy ml-learned limited to the demo's namespace and examples/pytorchjob.yaml,
# waits for the real training operator's pods to be injected by the webhook
# and bound, plays each pod's sidecar and 8 ranks here on the real plugin
# (rewards through TokenReview-checked tokens), and shows the job's TuningRun
# with its measured speedup. Details: dynamiccl/demo/kube.py, docs/demo.md.
#
# usage: hack/demo-cluster.sh [--out DIR] [--steps N]   (default ./demo-cluster-out, 700)
#        hack/demo-cluster.sh --clean                    remove what it created
# needs: make tools (pinned binaries), make venv plugin
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${DYNAMICCL_CACHE:-$HOME/.cache/dynamiccl/v1}
cluster_dir=${DYNAMICCL_CLUSTER_DIR:-$cache/cluster}
if [[ " $* " != *" --clean "* ]]; then
  bash "$here/hack/cluster-up.sh" --no-build >&2
fi
exec "$here/.venv/bin/python" -m dynamiccl.demo.kube \
  --kubeconfig "$cluster_dir/kubeconfig" --bin-dir "$cluster_dir/bin" "$@"
