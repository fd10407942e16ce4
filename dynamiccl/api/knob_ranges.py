"""The values NCCL accepts for each per-job env knob, and the rule two of them share.

Facts, not choices: NCCL's "Environment Variables" page
(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html, one anchor per
variable, e.g. #nccl-ib-qps-per-connection) and, where it names no bound, NCCL's
source (github.com/NVIDIA/nccl, src/; the constants are cited, no code is copied):

- NCCL_NTHREADS: 64, 128, 256 or 512 threads per block.
- NCCL_BUFFSIZE: bytes, powers of 2 recommended (default 4 MiB); capped here at
  128 MiB: the buffer is allocated per channel and peer in GPU memory.
- NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS: 1..64 (MAXCHANNELS, src/include/device.h).
- NCCL_IB_QPS_PER_CONNECTION: "Number between 1 and 128, default is 1"
  (NCCL_IB_MAX_QPS 128, src/transport/net_ib/common.h).
- NCCL_IB_SPLIT_DATA_ON_QPS: "0 or 1" (split each message over the QPs, or round-robin).
- NCCL_NCHANNELS_PER_NET_PEER: channels to one network peer (point-to-point, all-to-all);
  NCCL refuses a communicator config outside 1..MAXCHANNELS (src/init.cc).
- NCCL_P2P_NET_CHUNKSIZE: bytes of each send/recv message over the network, "The default
  is 131072 (128 K) ... The recommendation is to use powers of 2"; 1 KiB..16 MiB here:
  NCCL lowers a chunk above NCCL_BUFFSIZE / NCCL_STEPS (8) to that (src/init.cc), so
  128 MiB / 8 is the most any allowed buffer uses.
- NCCL_SOCKET_NTHREADS: "1 to 16" (MAX_THREADS, src/transport/net_socket.cc).
- NCCL_NSOCKS_PERTHREAD: sockets per helper thread; "the product of NCCL_SOCKET_NTHREADS
  and NCCL_NSOCKS_PERTHREAD cannot exceed 64" (MAX_SOCKETS), so 1..64 alone.
- NCCL_CROSS_NIC: 0 (same NIC per ring/tree), 1 (any NIC), 2 (default: same NIC first).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Final

from dynamiccl.api.knob_experiment import KnobName


def _powers_of_two(low_exp: int, high_exp: int) -> tuple[int, ...]:
    return tuple(1 << k for k in range(low_exp, high_exp + 1))


KNOB_VALUES: Final[dict[KnobName, tuple[int, ...]]] = {
    KnobName.NCCL_NTHREADS: (64, 128, 256, 512),
    KnobName.NCCL_BUFFSIZE: _powers_of_two(10, 27),  # 1 KiB .. 128 MiB
    KnobName.NCCL_MIN_NCHANNELS: tuple(range(1, 65)),
    KnobName.NCCL_MAX_NCHANNELS: tuple(range(1, 65)),
    KnobName.NCCL_IB_QPS_PER_CONNECTION: tuple(range(1, 129)),
    KnobName.NCCL_IB_SPLIT_DATA_ON_QPS: (0, 1),
    KnobName.NCCL_NCHANNELS_PER_NET_PEER: tuple(range(1, 65)),
    KnobName.NCCL_P2P_NET_CHUNKSIZE: _powers_of_two(10, 24),  # 1 KiB .. 16 MiB
    KnobName.NCCL_SOCKET_NTHREADS: tuple(range(1, 17)),
    KnobName.NCCL_NSOCKS_PERTHREAD: tuple(range(1, 65)),
    KnobName.NCCL_CROSS_NIC: (0, 1, 2),
}

# (a, b, limit): a x b must not exceed limit where a job sets both (NCCL would lower one
# of them and run another value than the one measured)
PRODUCT_LIMITS: Final[tuple[tuple[KnobName, KnobName, int], ...]] = (
    (KnobName.NCCL_SOCKET_NTHREADS, KnobName.NCCL_NSOCKS_PERTHREAD, 64),
)


def consecutive(values: tuple[int, ...]) -> bool:
    """Are the values a run of integers? Pairwise, never materialising the range: a
    tuple(range(...)) over NCCL_BUFFSIZE's span took 5 GB and 30 s at import."""
    return all(b == a + 1 for a, b in itertools.pairwise(values))


def _is_power_run(values: tuple[int, ...]) -> bool:
    return values[0] & (values[0] - 1) == 0 and all(
        b == 2 * a for a, b in itertools.pairwise(values)
    )


def knob_range_text(name: KnobName) -> str:
    """The values NCCL documents for a knob, in words (for error messages)."""
    values = KNOB_VALUES[name]
    if consecutive(values):
        return f"{values[0]}..{values[-1]}"
    if len(values) > 4 and _is_power_run(values):
        return f"a power of 2 from {values[0]} to {values[-1]}"
    return ", ".join(map(str, values))


def product_text(a: KnobName, b: KnobName, limit: int) -> str:
    """The joint rule in words."""
    return f"{a.value} x {b.value} must not exceed {limit} (NCCL's documented limit)"


def exceeded_products(values: Mapping[KnobName, int]) -> list[tuple[KnobName, KnobName]]:
    """The pairs of `PRODUCT_LIMITS` whose product `values` sets over the limit."""
    return [
        (a, b)
        for a, b, limit in PRODUCT_LIMITS
        if a in values and b in values and values[a] * values[b] > limit
    ]
