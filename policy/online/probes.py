"""Which (algorithm, protocol) pairs a cell's table leaves out get one look
(`RaceConfig.probe_pairs`): the rule the sidecar (sidecar/tuning.py) and `dynamiccl bench
tune` in the sidecar's setting (policy/eval/bench_tune.py) both apply.

The table holds the policy's most probable configurations, often channel variants of one
or two pairs, so a pair the policy ranks low is never tried unless it is probed. A probe
costs a call, and on many shapes some pairs are several times slower than the best (LL at
large sizes, Ring across many nodes): a call of a pair 5x slower costs as much as five
calls. NCCL's own cost model says which pairs are that far off; its errors are tens of
percent, not factors. So a pair is probed only while NCCL's estimate for it is within
`1 + reach` times the best pair's estimate, best estimate first (`RaceConfig.probe_reach`,
3x by default: in `bench tune --peers` a reach of 0.5 / 1 / 2 / unbounded gives 2.98 /
2.77 / 2.48 / 1.41 % mean final regret where a pair the prior ranks low is 10 % faster,
at 8.21 / 8.27 / 8.42 / 12.73 % exploration cost on the perturbed surfaces).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping
from typing import TypeVar

P = TypeVar("P", bound=Hashable)


def probe_order(estimates: Mapping[P, float], have: Collection[P], reach: float) -> list[P]:
    """The pairs to probe, best estimate first: every pair of `estimates` (NCCL's time
    estimate per pair; inf or nan: NCCL cannot run it) not in `have` (the table's pairs)
    whose estimate is at most `(1 + reach)` x the lowest estimate of all pairs."""
    if reach < 0:
        raise ValueError(f"reach must be >= 0, got {reach}")
    finite = {p: t for p, t in estimates.items() if math.isfinite(t) and t > 0}
    if not finite:
        return []
    limit = (1.0 + reach) * min(finite.values())
    rank = {p: i for i, p in enumerate(finite)}
    out = [p for p, t in finite.items() if p not in have and t <= limit]
    return sorted(out, key=lambda p: (finite[p], rank[p]))
