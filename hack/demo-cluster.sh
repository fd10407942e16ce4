#!/usr/bin/env bash
# make demo-cluster: issue 21's story on the local control plane.
#
# Starts (or reuses) the local control plane of hack/cluster-up.sh, installs
# charts/dynamiccl with helm, runs the chart's operator and reward ingest (with
# the learning loop) as local processes on a throw-away PostgreSQL store, applies
# the demo's learned policy, then runs PyTorchJobs of one hardware class in a
# row: each job's calls through the real plugin .so and the sidecar's pieces
# (rewards through TokenReview-checked tokens), the learning loop between jobs
# (retraining Job's pod played here: kwok runs no containers). One line per job:
# model version, whether its table runs what exploration found, speedup,
# exploratory calls and their cost. Details: dynamiccl/demo/kube.py, docs/demo.md.
#
# usage: hack/demo-cluster.sh [--out DIR] [--jobs N] [--calls C] [--no-departure]
#                             [--canary-percent P] [--store postgres|sqlite]
#        hack/demo-cluster.sh --one-job [--steps N]   the single-job story (real sidecars)
#        hack/demo-cluster.sh --clean                 remove what it created
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
