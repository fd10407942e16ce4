"""The custom resources DynamICCL defines: one descriptor each.

The operator's CRD generator (``dynamiccl.operator.crdgen``) turns these
descriptors and their pydantic models into CustomResourceDefinition YAML
(``crds/`` and the chart). Printer columns are JSONPaths over the wire form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from dynamiccl.api import node_topology, tuning_policy, tuning_run
from dynamiccl.constants import API_VERSION, GROUP


@dataclass(frozen=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry."""

    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class CustomResource:
    """Everything needed to generate one CRD."""

    kind: str
    plural: str
    singular: str
    scope: Literal["Namespaced", "Cluster"]
    spec: type[BaseModel] | None
    status: type[BaseModel] | None
    description: str
    short_names: tuple[str, ...] = ()
    columns: tuple[PrinterColumn, ...] = ()
    categories: tuple[str, ...] = ("dynamiccl",)
    group: str = GROUP
    version: str = API_VERSION

    @property
    def name(self) -> str:
        """The CRD's metadata.name."""
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        """`apiVersion` of the custom objects."""
        return f"{self.group}/{self.version}"


NCCL_TUNING_POLICY = CustomResource(
    kind=tuning_policy.KIND,
    plural=tuning_policy.PLURAL,
    singular="nccltuningpolicy",
    scope="Cluster",
    spec=tuning_policy.NCCLTuningPolicySpec,
    status=tuning_policy.NCCLTuningPolicyStatus,
    description="Cluster-wide rules for tuning NCCL in training jobs: which jobs, which "
    "actions, exploration budget, guardrails, model rollout, retraining.",
    short_names=("ntp",),
    columns=(
        PrinterColumn("Mode", "string", ".spec.mode", "off, observe, static or learned"),
        PrinterColumn("Priority", "integer", ".spec.priority", "higher wins among matches"),
        PrinterColumn("Model", "string", ".spec.model.version", "model version jobs get"),
        PrinterColumn("Canary", "string", ".spec.model.canaryVersion", "canary model version"),
        PrinterColumn("Canary%", "integer", ".spec.model.canaryPercent", "share of new jobs"),
        PrinterColumn("Jobs", "integer", ".status.matchedJobs", "jobs currently matched"),
    ),
)

TUNING_RUN = CustomResource(
    kind=tuning_run.KIND,
    plural=tuning_run.PLURAL,
    singular="tuningrun",
    scope="Namespaced",
    spec=tuning_run.TuningRunSpec,
    status=tuning_run.TuningRunStatus,
    description="One training job's NCCL tuning: its state features, the policy and model "
    "that decide for it, and whether tuning helps (measured vs NCCL-default time).",
    short_names=("tr",),
    columns=(
        PrinterColumn("Job", "string", ".spec.jobRef.name", "the training job"),
        PrinterColumn("Kind", "string", ".spec.jobRef.kind", "job kind", priority=1),
        PrinterColumn("Policy", "string", ".spec.policyName", "matched NCCLTuningPolicy"),
        PrinterColumn("Mode", "string", ".spec.mode", "tuning mode"),
        PrinterColumn("Model", "string", ".spec.modelVersion", "model version", priority=1),
        PrinterColumn("World", "integer", ".spec.features.world_size", "ranks"),
        PrinterColumn("Tier", "string", ".spec.features.topology.tier_max", "worst tier"),
        PrinterColumn("Phase", "string", ".status.phase", "tuning phase"),
        PrinterColumn(
            "Speedup", "number", ".status.reward.speedup", "NCCL-default time / measured time"
        ),
    ),
)

NODE_TOPOLOGY = CustomResource(
    kind=node_topology.KIND,
    plural=node_topology.PLURAL,
    singular=node_topology.SINGULAR,
    scope="Cluster",
    spec=node_topology.NodeTopologySpec,
    status=node_topology.NodeTopology,
    description="What the DynamICCL node agent discovered about one node (name = node "
    "name): GPUs, NVLink, NICs, fabric, SHARP, container boundary; written by the agent.",
    short_names=node_topology.SHORT_NAMES,
    columns=(
        PrinterColumn("GPU", "string", ".status.spec.gpu", "GPU model"),
        PrinterColumn("GPUs", "integer", ".status.spec.gpus_per_node", "GPUs on the node"),
        PrinterColumn("Intra", "string", ".status.intra", "intra-node interconnect"),
        PrinterColumn("Fabric", "string", ".status.fabric", "inter-node fabric"),
        PrinterColumn("NICs", "integer", ".status.nicsPerNode", "fabric NICs"),
        PrinterColumn("Gbps", "number", ".status.nicGbps", "per-NIC speed"),
    ),
)

CUSTOM_RESOURCES: tuple[CustomResource, ...] = (NCCL_TUNING_POLICY, TUNING_RUN, NODE_TOPOLOGY)
