"""Is every training process measured? The plugin says which ABIs NCCL loaded.

The plugin writes, into its process slot, the tuner and profiler ABI versions
NCCL loaded (bytes 32 and 33; 0 = not loaded). NCCL loads profiler ABI v4+ only
from 2.27 on, so on NCCL 2.21-2.26 the tuner runs the table and nothing is
measured: no rewards, no online tuning, no learning. The sidecar reports that
instead of staying silent: a gauge, one warning per process, and a count in its
summary.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.shm import ProcSlot

log = logging.getLogger("dynamiccl.sidecar")


def unmeasured(procs: Sequence[ProcSlot]) -> list[ProcSlot]:
    """Processes whose NCCL loaded the tuner but no profiler."""
    return [p for p in procs if p.tuner_abi and not p.profiler_abi]


class MeasurementWatch:
    """Counts unmeasured processes into the metrics; warns once per process."""

    def __init__(self, metrics: AgentMetrics) -> None:
        self.metrics = metrics
        self.count = 0
        self._warned: set[tuple[int, int]] = set()

    def check(self, procs: Sequence[ProcSlot]) -> int:
        found = unmeasured(procs)
        self.count = len(found)
        self.metrics.unmeasured_processes.set(self.count)
        for p in found:
            if (p.pid, p.generation) not in self._warned:
                self._warned.add((p.pid, p.generation))
                log.warning(
                    "pid %d: NCCL loaded the tuner (ABI v%d) but no profiler: tuned, not "
                    "measured (NCCL < 2.27 loads no profiler ABI v4+)",
                    p.pid,
                    p.tuner_abi,
                )
        return self.count
