#!/usr/bin/env bash
# make demo-cluster: issue 21's story on the local control plane.
#
# Two modes (docs/demo.md):
#
# real node (the default when run as root and the real node `real-node-0` of
#   hack/real-node.sh is Ready): takes the real tier's lock, brings the node up
#   with the built images (hack/real-node.sh up --with-trainer: builds them first
#   if the tree changed), helm-installs charts/dynamiccl there (operator, webhook,
#   ingest with the learning loop, store, node agent in real containers) and runs
#   PyTorchJobs in a row whose pods run on the real node and play their
#   collectives through the real plugin .so; after the job whose exploration
#   found the departure, the loop's retraining Job runs the trainer image there,
#   the next jobs get its canary, the judge promotes it. Uninstalls at the end.
#   Details: dynamiccl/demo/real_sequence.py.
#
# --kwok (or DYNAMICCL_DEMO_KWOK=1): the chart's operator and ingest as local
#   processes, PyTorchJobs on kwok nodes whose calls are played here, the
#   retraining Job's pod played here. Details: dynamiccl/demo/kube_driver.py.
#
# usage: hack/demo-cluster.sh [--jobs N] [--steps S] [--out DIR] [--reuse-images]   real node
#        hack/demo-cluster.sh --kwok [--out DIR] [--jobs N] [--calls C] [--no-departure]
#                             [--canary-percent P] [--store postgres|sqlite]
#        hack/demo-cluster.sh [--kwok] --clean               remove what it created
# needs: make tools (pinned binaries), make venv plugin; the real node: root
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${DYNAMICCL_CACHE:-$HOME/.cache/dynamiccl/v1}
cluster_dir=${DYNAMICCL_CLUSTER_DIR:-$cache/cluster}
mode=real
args=()
for a in "$@"; do
  if [[ "$a" == "--kwok" ]]; then mode=kwok; else args+=("$a"); fi
done
[[ "${DYNAMICCL_DEMO_KWOK:-0}" == "1" ]] && mode=kwok
if [[ " ${args[*]-} " != *" --clean "* ]]; then
  bash "$here/hack/cluster-up.sh" --no-build >&2
fi
if [[ "$mode" == "real" ]]; then
  # the real node: Ready now, or set up on this machine before and down for a moment (another
  # real-tier session restarting it holds the lock; the demo waits for it, then `real-node.sh up`)
  ready=$("$cluster_dir/bin/kubectl" --kubeconfig "$cluster_dir/kubeconfig" get node real-node-0 \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
  if [[ "$(id -u)" != "0" ]] || [[ "$ready" != "True" && ! -d "$cluster_dir/node/pids" ]]; then
    echo "demo-cluster: no real node (or not root): the kwok mode" \
      "(hack/real-node.sh up, as root, for the real one)" >&2
    mode=kwok
  fi
fi
module=dynamiccl.demo.kube_driver
[[ "$mode" == "real" ]] && module=dynamiccl.demo.real_node
exec "$here/.venv/bin/python" -m "$module" \
  --kubeconfig "$cluster_dir/kubeconfig" --bin-dir "$cluster_dir/bin" ${args[@]+"${args[@]}"}
