"""`make demo-cluster` on the real node, shorter: found, retrained on the node, the canary runs it.

Runs `hack/demo-cluster.sh --jobs 3` as a user does (the real-node mode, chosen
because this runs as root with `real-node-0` Ready): the demo takes the real
tier's lock, helm-installs the chart on the real node, runs 3 PyTorchJobs in a
row whose pods (2 x 4 ranks) play a DDP step through the real plugin `.so` on
the surface where NVLS runs 1.8x slower than NCCL's model says for all-reduce
>= 32 MiB, retrains after the first job whose exploration found a faster
configuration, and uninstalls at the end. The effect, from what the demo left in
its output directory (summary.json, the jobs' ConfigMaps, the models):

- the retraining Job's pod ran the trainer image on `real-node-0` and succeeded;
- a job after the retrain has a TuningRun naming the retrained version as its
  canary model, its table is the one compiled from that model (recompiled here
  from the model file for the job's features) with the cells its TuningRun says
  came from the class's measurements (`measuredCells`, issue 29: a configuration
  several jobs measured faster than NCCL's own starts every new job) and leaves
  NVLS where the parent's table (job 1) did not;
- that job's measured speedup over NCCL's pick is higher than the first job's by
  more than the noise of an untuned job (`MIN_GAIN`).

Stand-ins: no GPU (the node carries the labels of an 8-GPU H100 NVSwitch node; a
call's time is the simulator's with the departure), and the retraining trigger
(the demo opens the policy's `minNewExperience` once after the finding job).

It takes 3.5-5 min (measured 213 s with the images imported and the lock free:
3 jobs of ~48 s, the retrain ~13 s, install and uninstall ~50 s; 289 s in a run
that also imported the trainer image), over the ~2-3 min the real tier may add
to `make test`: it runs only with
DYNAMICCL_REAL_DEMO=1, on its own (the tier's session release holds the same
lock: in a session with other real-tier tests that took it, it fails at once):
    DYNAMICCL_REAL_DEMO=1 DYNAMICCL_REAL_REUSE_IMAGES=1 \\
        .venv/bin/python -m pytest -m real -q -s tests/real/test_demo_real.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import DecisionTable, scale_class
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.real_manifests import NODE_NAME
from dynamiccl.policy.runtime.compile import compile_table
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from tests.real.conftest import HACK_DIR, RealCluster, _cluster_dir
from tests.real.learning_support import Cell, first_choices

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        os.environ.get("DYNAMICCL_REAL_DEMO") != "1",
        reason="~4.5 min: runs with DYNAMICCL_REAL_DEMO=1 (see the module docstring)",
    ),
]

JOBS: Final = 3
# an untuned job's speedup sits within 0.993-1.0001 of NCCL's (test_training_real.py); the
# retrained table's gain must stand well clear of that
MIN_GAIN: Final = 1.05


def _lock_held_here() -> bool:
    """Does this process hold the real-tier lock (/proc/locks: `N: FLOCK ADVISORY WRITE pid
    maj:min:inode ...`; a waiter's line has `->`)?"""
    lock = _cluster_dir() / "real-tier.lock"
    if not lock.exists():
        return False
    ino = lock.stat().st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if "->" not in f and len(f) > 5 and f[1] == "FLOCK" and f[5].endswith(f":{ino}"):
            return int(f[4]) == os.getpid()
    return False


def _configmaps(out: Path) -> dict[str, dict[str, str]]:
    items = yaml.safe_load((out / "configmaps.yaml").read_text())["items"]
    return {cm["metadata"]["name"]: cm.get("data") or {} for cm in items}


# one line of a TuningRun's measuredCells (policy/runtime/measured.py, describe)
_MEASURED: Final = re.compile(r"^(\w+)/b(\d+)/(\d+)x(\d+): (\w+)/(\w+)[ /]")


def _measured(out: Path, job: str) -> dict[Cell, tuple[Algo, Proto]]:
    """The cells of `job`'s table that its TuningRun says came from the class's findings."""
    items = yaml.safe_load((out / "tuningruns.yaml").read_text())["items"]
    [run] = [i for i in items if i["spec"]["jobRef"]["name"] == job]
    cells: dict[Cell, tuple[Algo, Proto]] = {}
    for line in run["spec"].get("measuredCells") or []:
        m = _MEASURED.match(line)
        assert m, line
        coll, bucket, nranks, nnodes, algo, proto = m.groups()
        key = (Collective(coll), int(bucket), scale_class(int(nranks), int(nnodes)))
        cells[key] = (Algo(algo), Proto(proto))
    return cells


def _compiled(npz: Path, data: dict[str, str], spec: NCCLTuningPolicySpec) -> DecisionTable:
    feats = StateFeatures.model_validate_json(data["features.json"])
    return compile_table(NumpyPolicy.load(npz), feats, spec)


def test_the_real_node_demo_retrains_and_the_canary_runs_faster(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    if _lock_held_here():
        pytest.fail(
            "this session holds the real-tier lock (another real test's release): the demo "
            "would wait for itself; run tests/real/test_demo_real.py on its own"
        )
    out = tmp_path / "demo"
    env = dict(os.environ)
    cmd = ["bash", str(HACK_DIR / "demo-cluster.sh"), "--jobs", str(JOBS), "--out", str(out)]
    run = subprocess.run(
        [*cmd, "--reuse-images"], capture_output=True, text=True, env=env, timeout=1200, check=False
    )
    print(run.stdout)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-4000:]}"
    assert (out / "summary.json").exists(), f"not the real-node mode:\n{run.stderr[-2000:]}"
    s: dict[str, Any] = json.loads((out / "summary.json").read_text())
    jobs = s["jobs"]
    assert len(jobs) == JOBS

    # the retrain: the loop's Job, the trainer image, on the real node
    rt = s["retrain"]
    assert rt, f"no job's exploration found the departure: {[j['found'] for j in jobs]}"
    assert rt["succeeded"], rt
    assert rt["node"] == NODE_NAME, rt
    assert rt["image"] == s["images"]["DYNAMICCL_IMAGE_TRAIN"], (rt, s["images"])
    version = rt["version"]

    # a job after it: its TuningRun names the canary; its table is the new model's and leaves NVLS
    first = jobs[0]
    after = [j for j in jobs if j["model_version"] == version]
    assert after, f"no job ran {version}: {[j['model_version'] for j in jobs]}"
    job = after[0]
    assert job["canary"] is True, job
    assert first["model_version"] == "default", first
    assert not first["avoids"], first
    assert job["avoids"], job
    spec = NCCLTuningPolicySpec.model_validate(
        yaml.safe_load((out / "policy.yaml").read_text())["spec"]
    )
    cms = _configmaps(out)
    data = cms[f"{job['name']}-dynamiccl"]
    table = DecisionTable.model_validate_json(data["table.json"])
    npz = out / "models" / version / "model.npz"
    measured = _measured(out, job["name"])
    assert first_choices(table) == first_choices(_compiled(npz, data, spec)) | measured
    assert first_choices(table) != first_choices(_compiled(DEFAULT_NPZ, data, spec))

    # the effect: measurably faster than the first job
    gain = job["speedup"] / first["speedup"]
    assert gain > MIN_GAIN, (first["speedup"], job["speedup"])
    print(json.dumps({"demo_real": {
        "speedups": [j["speedup"] for j in jobs], "gain": round(gain, 3),
        "found_at": s["found_at"], "adopted_at": s["adopted_at"], "wall_s": s["wall_s"],
        "retrain_s": rt["trigger_to_finished_s"], "measured_cells": len(measured),
    }}))  # fmt: skip
