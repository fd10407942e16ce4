"""Which per-job env knobs can matter on a hardware class, and on one job.

The network knobs belong to one NCCL transport or need a network at all
(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html; NCCL's source):

- `NCCL_IB_QPS_PER_CONNECTION`, `NCCL_IB_SPLIT_DATA_ON_QPS`: NCCL's IB verbs
  transport, which serves InfiniBand and RoCE (not EFA: AWS's net plugin; not
  TCP);
- `NCCL_SOCKET_NTHREADS`, `NCCL_NSOCKS_PERTHREAD`: NCCL's socket transport, the
  one a TCP (ethernet) fabric uses;
- `NCCL_NCHANNELS_PER_NET_PEER`, `NCCL_P2P_NET_CHUNKSIZE`: NCCL's core, for any
  transfer over a network (NCCL uses the network chunk size only for
  communicators spanning more than one node: src/init.cc);
- `NCCL_CROSS_NIC`: rings and trees over several NICs; "This has no effect on
  systems with only one NIC".

A knob that cannot matter on a class keeps its declared default in every arm
(harmless, and every arm stays comparable), but its other values are not
tried there: an arm that changes nothing only takes jobs and widens every
other arm's interval. Jobs on one node never touch the network, so they do
not try network values either (they still get an adopted arm).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from dynamiccl.api.features import StateFeatures, TopologyFeatures
from dynamiccl.api.knob_experiment import KnobName
from dynamiccl.api.topology import Fabric

K = KnobName
IB_KNOBS: Final = frozenset({K.NCCL_IB_QPS_PER_CONNECTION, K.NCCL_IB_SPLIT_DATA_ON_QPS})
SOCKET_KNOBS: Final = frozenset({K.NCCL_SOCKET_NTHREADS, K.NCCL_NSOCKS_PERTHREAD})
NET_KNOBS: Final = frozenset({K.NCCL_NCHANNELS_PER_NET_PEER, K.NCCL_P2P_NET_CHUNKSIZE})
NETWORK_KNOBS: Final = IB_KNOBS | SOCKET_KNOBS | NET_KNOBS | {K.NCCL_CROSS_NIC}
IB_FABRICS: Final = frozenset({Fabric.INFINIBAND, Fabric.ROCE})
SOCKET_FABRICS: Final = frozenset({Fabric.ETHERNET})


def _why_not(knob: KnobName, t: TopologyFeatures) -> str | None:
    """Why `knob` cannot matter on nodes like these (None: it can)."""
    if knob not in NETWORK_KNOBS:
        return None
    if t.fabric is Fabric.NONE or t.nics_per_node == 0:
        return "a network knob; this class has no network"
    fabric = f"this class's fabric is {t.fabric.value}"
    if knob in IB_KNOBS and t.fabric not in IB_FABRICS:
        return f"NCCL's IB verbs transport's (infiniband, roce); {fabric}"
    if knob in SOCKET_KNOBS and t.fabric not in SOCKET_FABRICS:
        return f"NCCL's socket transport's (ethernet, TCP); {fabric}"
    if knob is K.NCCL_CROSS_NIC and t.nics_per_node < 2:
        return "no effect with one NIC per node (NCCL's documentation); this class has 1"
    return None


def class_skips(knobs: Iterable[KnobName], topology: TopologyFeatures) -> dict[KnobName, str]:
    """The declared knobs that cannot matter on this hardware class, with the reason."""
    return {k: why for k in knobs if (why := _why_not(k, topology)) is not None}


def job_skips(knobs: Iterable[KnobName], features: StateFeatures) -> dict[KnobName, str]:
    """The declared knobs one job does not try: its class's, and on one node every
    network knob."""
    names = list(knobs)
    out = class_skips(names, features.topology)
    if features.topology.nodes == 1:
        for k in names:
            if k in NETWORK_KNOBS and k not in out:
                out[k] = "a network knob; the job runs on one node"
    return out


def skip_text(skips: dict[KnobName, str]) -> str:
    """The skipped knobs in a sentence, one reason each ("" when none)."""
    by_reason: dict[str, list[str]] = {}
    for knob, why in skips.items():
        by_reason.setdefault(why, []).append(knob.value)
    return "; ".join(f"not tried: {', '.join(sorted(ks))} ({why})" for why, ks in by_reason.items())
