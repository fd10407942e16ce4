"""NCCL's tuning constants, NCCL 2.27 (`src/graph/tuning.cc`, `src/include/device.h`).

Values as in the tuner-constant defaults of NVIDIA/nccl `src/graph/tuning.cc`
(2.27 / 2.28 series; the Hopper numbers are unchanged since 2.23, the PAT row
exists since 2.23, `nvlsEfficiency` since 2.26). Indexes: [algorithm][protocol]
with NCCL's order (Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT)
x (LL, LL128, Simple); hardware rows (NVLink, PCI, Network); arch rows (Volta,
Ampere, Hopper, Blackwell); node buckets (1, 2, >=4 nodes).
"""

from __future__ import annotations

from typing import Final

import numpy as np

# Latencies in us. baseLatencies[algo][proto].
BASE_LAT: Final = np.array(
    [
        [6.8, 14.0, 8.4],  # Tree
        [6.6, 14.0, 8.4],  # Ring
        [0.0, 0.0, 0.0],  # CollNetDirect
        [0.0, 0.0, 0.0],  # CollNetChain
        [0.0, 0.0, 0.0],  # NVLS
        [0.0, 0.0, 0.0],  # NVLSTree
        [8.0, 8.0, 8.0],  # PAT
    ]
)
HW_NVLINK: Final = 0
HW_PCI: Final = 1
HW_NET: Final = 2
# hwLatencies[hw][algo][proto].
HW_LAT: Final = np.array(
    [
        [  # NVLink
            [0.6, 1.25, 4.0],
            [0.6, 1.9, 3.4],
            [0.0, 0.0, 3.7],
            [0.0, 0.0, 2.8],
            [0.0, 0.0, 25.0],
            [0.0, 0.0, 25.0],
            [0.0, 0.0, 4.0],
        ],
        [  # PCI
            [1.0, 1.9, 4.0],
            [1.0, 2.5, 5.7],
            [0.0, 0.0, 3.7],
            [0.0, 0.0, 2.8],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 4.0],
        ],
        [  # Network
            [5.0, 8.5, 14.0],
            [2.7, 4.0, 14.0],
            [0.0, 0.0, 31.0],
            [0.0, 0.0, 30.0],
            [0.0, 0.0, 18.0],
            [0.0, 0.0, 20.9],
            [0.0, 0.0, 14.0],
        ],
    ]
)
# llMaxBws[arch-or-cpu][nodeBucket]: single node indexed by GPU arch, multi-node
# by CPU vendor (row 0 Intel, row 1 AMD).
LL_MAX_BW: Final = np.array(
    [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282.0, 90.0, 70.0]]
)
PER_CH_MAX_RING_LL128: Final = np.array(
    [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 36.7], [40.0, 40.0, 40.0]]
)
PER_CH_MAX_TREE_LL128: Final = np.array(
    [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]]
)
PER_CH_MAX_TREE: Final = np.array(
    [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]]
)
PER_CH_MAX_NVLS_TREE: Final = np.array(
    [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]]
)
NVLS_EFFICIENCY: Final = (0.0, 0.0, 0.85, 0.74)  # Volta, Ampere, Hopper, Blackwell

# Trees are not perfectly sticking to the model for medium sizes (NCCL's comment):
# treeCorrectionFactor[proto][log2(nBytes >> 6)], applied for 0 <= log < 23.
_TREE_CORRECTION_LL: Final = (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5)
_TREE_CORRECTION_LL_HI: Final = (0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0)
_TREE_CORRECTION_LL128: Final = (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6)
_TREE_CORRECTION_LL128_HI: Final = (0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0, 1.0)
_TREE_CORRECTION_SIMPLE: Final = (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5)
_TREE_CORRECTION_SIMPLE_HI: Final = (0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9, 0.9)
TREE_CORRECTION: Final = np.array(
    [
        _TREE_CORRECTION_LL + _TREE_CORRECTION_LL_HI,
        _TREE_CORRECTION_LL128 + _TREE_CORRECTION_LL128_HI,
        _TREE_CORRECTION_SIMPLE + _TREE_CORRECTION_SIMPLE_HI,
    ]
)
TREE_CORRECTION_SIZES: Final = 23

# src/include/device.h and comm.h.
LL_MAX_NTHREADS: Final = 512
LL128_MAX_NTHREADS: Final = 640
SIMPLE_MAX_NTHREADS: Final = 512
MAX_NTHREADS: Final = 640
LL_THREAD_THRESHOLD: Final = 8
LL128_THREAD_THRESHOLD: Final = 8
SIMPLE_THREAD_THRESHOLD: Final = 64
PCI_BW: Final = 12.0
MAX_DIRECT_ARITY_PLUS_ONE: Final = 8  # NCCL_MAX_DIRECT_ARITY + 1
MAX_NVLS_ARITY: Final = 32
