#!/usr/bin/env bash
# The GPU tier in one run (docs/gpu.md): on a machine with one GPU (or several), from the
# repository root, with the carry folder built here first (`.venv/bin/python hack/gpu_carry.py`):
#   1. facts: GPU, driver, torch, NCCL;
#   2. the response surface at 2 ranks, then the DDP loop at 2 ranks (hack/gpu_sweep.py,
#      hack/gpu_ddp.py), then both at 4 ranks; each step under its own time limit, so a slow
#      step costs its own results only;
#   3. results under $OUT (at most 8 files): summary.json, report.md, surface-{2,4}.csv,
#      nccl-pick-{2,4}.csv, logs.tar.gz (NCCL logs, rank and sidecar logs, per-step JSON),
#      run.log.
# Python: python3 with CUDA torch (PYTHON to override); wheels the image lacks come from
# .gpu-carry/wheels, the plugin from .gpu-carry/plugin.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
WORK=${GPU_WORK:-/tmp/dynamiccl-gpu}
PY=${PYTHON:-python3}
SO=$ROOT/.gpu-carry/plugin/libnccl-tuner-dynamiccl.so
GPUS=${GPUS:-}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/run.log") 2>&1
echo "gpu-run: start $(date -u +%FT%TZ) in $ROOT"
if ls .gpu-carry/wheels/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/dynamiccl-site .gpu-carry/wheels/*.whl || exit 1
  export PYTHONPATH=/tmp/dynamiccl-site:$ROOT
else
  export PYTHONPATH=$ROOT
fi
export PYTHONUNBUFFERED=1
[ -f "$SO" ] || { echo "gpu-run: $SO missing: run hack/gpu_carry.py where the repo was built"; exit 1; }
"$PY" - "$WORK/facts.json" <<'PYEOF' || exit 1
import json, subprocess, sys
import torch
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines()
facts = {"gpus": smi, "torch": torch.__version__, "cuda": torch.version.cuda,
         "nccl_torch": ".".join(map(str, torch.cuda.nccl.version())),
         "device_count": torch.cuda.device_count(), "python": sys.version.split()[0]}
json.dump(facts, open(sys.argv[1], "w"))
print("gpu-run: facts", json.dumps(facts))
PYEOF
"$PY" -c "import sys; sys.path.insert(0, 'hack'); import gpu_sweep, gpu_ddp, dynamiccl.sidecar.cli, dynamiccl.testing.local_ingest" \
  || { echo "gpu-run: the drivers do not import (a wheel missing from .gpu-carry?)"; exit 1; }
G=${GPUS:-$("$PY" -c 'import torch; print(torch.cuda.device_count())')}
if [ "$G" -ge 4 ] || [ "$G" -eq 1 ]; then RANKS=(2 4); else RANKS=(2); fi
for n in "${RANKS[@]}"; do
  t_sweep=100; t_ddp=$(( n == 2 ? 100 : 110 ))  # 410 s in all
  echo "gpu-run: sweep, $n ranks (limit ${t_sweep}s)"
  timeout -k 5 "$t_sweep" "$PY" hack/gpu_sweep.py --ranks "$n" --gpus "$G" --out "$WORK" --so "$SO" \
    --deadline-s $(( t_sweep - 20 )) || echo "gpu-run: sweep $n ranks exited $?"
  echo "gpu-run: DDP, $n ranks (limit ${t_ddp}s)"
  timeout -k 5 "$t_ddp" "$PY" hack/gpu_ddp.py --ranks "$n" --gpus "$G" --out "$WORK" --so "$SO" \
    --steps "${DDP_STEPS:-40}" || echo "gpu-run: ddp $n ranks exited $?"
done
"$PY" hack/gpu_report.py --work "$WORK" --out "$OUT" --command "$0 $*" || echo "gpu-run: report failed"
tar -C "$WORK" -czf "$OUT/logs.tar.gz" --exclude='*.shm' --exclude='*.sqlite*' . 2>/dev/null
echo "gpu-run: done $(date -u +%FT%TZ); $(ls "$OUT" | tr '\n' ' ')"
