"""Objects of training jobs on the real node (`hack/real-node.sh`), built without a cluster.

Shared by the real-node demo (`real_sequence.py`) and the real test tier
(`tests/real/`): what puts a pod on the real node, the labels that describe it
as a GPU node, the response surface's departure, the PyTorchJob whose main
container runs `harness_pod.py`, and that script's ConfigMaps.

Stand-ins, said where they matter:
- the real node has no GPU: `gpu_labels` gives it the labels GPU Feature
  Discovery and topograph put on an 8-GPU NVSwitch node, so the operator
  describes (and the model tunes for) such a node;
- call times come from a response surface (`harness_pod.py`): the calibrated
  simulator's times for the job's topology (`times_data`, from the features the
  operator observed), except where `DEPARTURE` says reality differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Collective
from dynamiccl.policy.runtime.encode import job_spec
from dynamiccl.testing import builders
from dynamiccl.testing.workload import Op, build_time_table

HARNESS_POD: Final = Path(__file__).resolve().parent / "harness_pod.py"
# What the harness script imports that the runtime image does not ship (the wheel leaves out
# dynamiccl.testing), carried in the harness ConfigMap: key -> path under
# the package (mounted at HARNESS_DIR/dynamiccl/..., `harness_pod.py` puts it on the path)
_PACKAGE: Final = Path(__file__).resolve().parents[1]
PLAYER_FILES: Final = {
    "testing-init.py": "testing/__init__.py",
    "nccl_player.py": "testing/nccl_player.py",
    "nccl_profiler.py": "testing/nccl_profiler.py",
    "rank.py": "testing/rank.py",
    "surface.py": "testing/surface.py",
    "workload.py": "testing/workload.py",
}
NODE_NAME: Final = "real-node-0"
NODE_LABEL: Final = "dynamiccl.io/real-node"
# what a pod needs to land on the real node (and only there: it is tainted)
ON_REAL_NODE: Final[dict[str, object]] = {
    "nodeSelector": {NODE_LABEL: "true"},
    "tolerations": [{"key": NODE_LABEL, "operator": "Exists"}],
}
PODS: Final = 2
RANKS_PER_POD: Final = 4  # rank processes per pod (harness_pod.py), as torchrun starts them

# Where the response surface departs from the simulator (and so from NCCL's cost model and
# the shipped prior, which agree with it on one NVSwitch node): all-reduce of 32 MiB and more
# runs 1.8x slower with NVLS, NCCL's pick there, than NCCL's model says (NVLS depends on the
# NVSwitches' multicast resources; NCCL cannot see them). Only measuring finds it.
DEPARTURE: Final[dict[str, Any]] = {
    "collective": "allreduce",
    "min_bytes": 32 << 20,
    "algo": "nvls",
    "slower": 1.8,
}

# A data-parallel (DDP) training step: six 32 MiB gradient buckets all-reduced, and the loss.
STEP: Final = (
    Op(Collective.ALLREDUCE, 32 << 20, 6, "gradient buckets (DDP's default 25 MiB, rounded)"),
    Op(Collective.ALLREDUCE, 6 * 1024, 1, "loss and gradient-norm statistics"),
)

NONROOT_POD: Final[dict[str, Any]] = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000}
HARDENED_CONTAINER: Final[dict[str, Any]] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def gpu_labels(product: str) -> dict[str, str]:
    """GPU Feature Discovery's and topograph's labels of an 8-GPU NVSwitch node of `product`."""
    return {
        c.NODE_LABEL_GFD_PRODUCT: product,
        c.NODE_LABEL_GFD_COUNT: "8",
        c.NODE_LABEL_TOPO_ACCELERATOR: f"nvl-{NODE_NAME}",
    }


@dataclass(frozen=True)
class Harness:
    """How long a job plays: steps of the training step (7 collectives), pacing."""

    steps: int = 3000
    step_s: float = 0.02  # 7 calls per step: 350 calls/s per rank
    seed: int = 3

    def args(self) -> dict[str, Any]:
        return {
            "nranks": PODS * RANKS_PER_POD,
            "nnodes": 1,
            "pods": PODS,
            "comm_id": 4242,
            "seed": self.seed,
            "steps": self.steps,
            "step_s": self.step_s,
            "ops": [[op.collective.nccl_id, op.nbytes, op.repeat] for op in STEP],
            "departure": DEPARTURE,
        }


def harness_data(h: Harness) -> dict[str, str]:
    """The `<job>-harness` ConfigMap's data: the script, its arguments and the player."""
    player = {key: (_PACKAGE / name).read_text() for key, name in PLAYER_FILES.items()}
    return {"harness_pod.py": HARNESS_POD.read_text(), "args.json": json.dumps(h.args()), **player}


def harness_items() -> list[dict[str, str]]:
    """The harness ConfigMap's keys as files of the mount (the carried modules under dynamiccl/)."""
    player = [{"key": k, "path": f"dynamiccl/{n}"} for k, n in PLAYER_FILES.items()]
    return [{"key": k, "path": k} for k in ("harness_pod.py", "args.json")] + player


def times_data(features: StateFeatures) -> tuple[str, dict[str, str]]:
    """The `<job>-times` ConfigMap's data: the simulator's times of the job's topology (from its
    TuningRun's features once the operator observed its pods); and the topology's name."""
    spec = job_spec(features)
    table = build_time_table(spec, STEP)
    return spec.name, {"times.json": table.model_dump_json()}


def pytorchjob(
    name: str, image: str, security: dict[str, Any], container_security: dict[str, Any]
) -> dict[str, Any]:
    """An annotated Worker-only PyTorchJob on the real node (a Master's replicas get the training
    operator's init container, which Pod Security `restricted` refuses: no securityContext).
    Its main container runs `harness_pod.py` from the `<name>-harness` ConfigMap with the
    surface of `<name>-times` (created once the pods are bound: the pods wait for it)."""
    volume = {
        "name": "harness",
        "projected": {
            "sources": [
                {"configMap": {"name": f"{name}-harness", "items": harness_items()}},
                {"configMap": {"name": f"{name}-times"}},
            ]
        },
    }
    container = builders.container(
        gpus=0,  # the real node has none
        image=image,
        command=["python", "/harness/harness_pod.py"],
        env={"HARNESS_DIR": "/harness"},
    )
    container["imagePullPolicy"] = "Never"
    container["volumeMounts"] = [{"name": "harness", "mountPath": "/harness", "readOnly": True}]
    container["securityContext"] = container_security
    template = builders.template(container)
    template["spec"].update(
        ON_REAL_NODE,
        securityContext={"seccompProfile": {"type": "RuntimeDefault"}, **security},
        volumes=[volume],
    )
    return builders.pytorchjob(
        name,
        annotations={c.ANNOTATION_TUNE: "true"},
        master=False,
        workers=PODS,
        pod=template,
        nproc_per_node=str(RANKS_PER_POD),
        restart_policy="Never",
    )


def chart_values(repository: str, tag: str, agent_ns: str, storage_class: str) -> dict[str, Any]:
    """The chart's values for the real node: built images, pods on the real node, the store on
    a local PersistentVolume of `storage_class`."""
    return {
        "image": {
            "repository": repository,
            "tag": tag,
            "pullPolicy": "Never",  # imported into containerd; there is no registry
        },
        "operator": {"replicas": 1, **ON_REAL_NODE},
        "ingest": dict(ON_REAL_NODE),
        "store": {"persistence": {"storageClass": storage_class}},
        "nodeAgent": {
            "namespace": agent_ns,
            # the real node is no GPU node: select it instead of GPU Feature Discovery's label
            "nodeSelector": {NODE_LABEL: "true", "nvidia.com/gpu.present": None},
        },
    }
