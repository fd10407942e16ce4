"""Streaming aggregation of measured collectives into reward records (pure, bounded memory).

One `Stats` per `Key` = (table version, collective, size bucket, nranks, nnodes,
configuration, origin, the calls' tag): call count, sum of times, byte range, and a sparse
log-spaced histogram of times (32 bins per octave: a bin spans 2.2 %, so the
p50 / p99 read from it are within ~1.1 % of the exact order statistics; they
are clamped to the observed minimum / maximum). Memory per key is bounded by
the histogram's range (at most ~1500 bins, typically a few dozen) and the
number of keys by `max_keys`: a sample of a new key beyond it is refused and
counted, never silently merged elsewhere.

Bus bandwidth follows nccl-tests (docs/simulator.md, 'Bus bandwidth'): bytes / time times
2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter, 1 for
broadcast and reduce; over a record it is total bytes / total time (the
throughput of the calls it aggregates).

The whole state round-trips through `to_state` / `from_state` (plain JSON
types) so the sidecar can persist it between its ring cursor moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from dynamiccl.api.nccl import algo_from_id, collective_from_id, proto_from_id
from dynamiccl.api.rewards import MAX_TIME_US, Origin, RewardRecord

SUB_BINS: Final = 32  # histogram bins per octave
MIN_TIME_US: Final = 1e-3  # below: counted in the lowest bin
DEFAULT_MAX_KEYS: Final = 4096


class Key(NamedTuple):
    """What one reward record aggregates."""

    table_version: int
    coll: int  # ncclFunc_t
    bucket: int
    nranks: int
    nnodes: int
    algo: int
    proto: int
    nchannels: int  # 0 = NCCL's
    chunk_bytes: int  # 0 = NCCL's
    origin: str  # an `Origin` value
    user_tag: int = 0  # the calls' tag (profiler v7 userTag): records keep it as a label


def bus_factor(coll: int, nranks: int) -> float:
    """nccl-tests' bus-bandwidth factor for a collective over `nranks` ranks."""
    n = max(nranks, 1)
    if coll == 4:  # all-reduce
        return 2.0 * (n - 1) / n
    if coll in (2, 3):  # all-gather, reduce-scatter
        return (n - 1) / n
    return 1.0


def time_bin(time_us: float) -> int:
    """Histogram bin of a time (floor of 32 * log2)."""
    return math.floor(math.log2(max(time_us, MIN_TIME_US)) * SUB_BINS)


def bin_value(b: int) -> float:
    """Geometric centre of a bin."""
    return float(2.0 ** ((b + 0.5) / SUB_BINS))


@dataclass
class Stats:
    """Running aggregates of one key."""

    count: int = 0
    sum_us: float = 0.0
    sum_bytes: int = 0
    min_bytes: int = 0
    max_bytes: int = 0
    min_us: float = 0.0
    max_us: float = 0.0
    hist: dict[int, int] = field(default_factory=dict)

    def add(self, nbytes: int, time_us: float) -> None:
        if self.count == 0:
            self.min_bytes = self.max_bytes = nbytes
            self.min_us = self.max_us = time_us
        else:  # min() and max() without their call (this runs for every record read)
            if nbytes < self.min_bytes:
                self.min_bytes = nbytes
            elif nbytes > self.max_bytes:
                self.max_bytes = nbytes
            if time_us < self.min_us:
                self.min_us = time_us
            elif time_us > self.max_us:
                self.max_us = time_us
        self.count += 1
        self.sum_us += time_us
        self.sum_bytes += nbytes
        b = time_bin(time_us)
        self.hist[b] = self.hist.get(b, 0) + 1

    @property
    def mean_us(self) -> float:
        return self.sum_us / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """Nearest-rank quantile from the histogram, clamped to [min, max]."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for b in sorted(self.hist):
            seen += self.hist[b]
            if seen >= rank:
                return min(max(bin_value(b), self.min_us), self.max_us)
        return self.max_us

    def to_state(self) -> list[Any]:
        return [
            self.count,
            self.sum_us,
            self.sum_bytes,
            self.min_bytes,
            self.max_bytes,
            self.min_us,
            self.max_us,
            sorted(self.hist.items()),
        ]

    @classmethod
    def from_state(cls, raw: list[Any]) -> Stats:
        c, s, sb, lo, hi, tlo, thi, hist = raw
        return cls(
            int(c),
            float(s),
            int(sb),
            int(lo),
            int(hi),
            float(tlo),
            float(thi),
            {int(b): int(n) for b, n in hist},
        )


class Aggregator:
    """Stats per key; `take` hands out finished keys (for a batch) and forgets them."""

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._stats: dict[Key, Stats] = {}
        self.refused = 0  # samples of new keys beyond max_keys

    def __len__(self) -> int:
        return len(self._stats)

    @property
    def calls(self) -> int:
        """Samples held."""
        return sum(s.count for s in self._stats.values())

    def add(self, key: Key, nbytes: int, time_us: float) -> bool:
        """Fold one sample in; False if refused (a new key beyond `max_keys`, or a bad time)."""
        if not (0.0 < time_us <= MAX_TIME_US) or nbytes < 0:
            self.refused += 1
            return False
        st = self._stats.get(key)
        if st is None:
            if len(self._stats) >= self.max_keys:
                self.refused += 1
                return False
            st = self._stats[key] = Stats()
        st.add(nbytes, time_us)
        return True

    def items(self) -> list[tuple[Key, Stats]]:
        """Everything held, in a stable order."""
        return sorted(self._stats.items())

    def versions(self) -> list[int]:
        """Table versions with open aggregates, oldest first."""
        return sorted({k.table_version for k in self._stats})

    def take(self, limit: int, table_version: int | None = None) -> list[tuple[Key, Stats]]:
        """Remove and return up to `limit` keys (of one table version, if given), stable order."""
        out = [
            kv
            for kv in self.items()
            if table_version is None or kv[0].table_version == table_version
        ][:limit]
        for k, _ in out:
            del self._stats[k]
        return out

    def to_state(self) -> dict[str, Any]:
        return {
            "refused": self.refused,
            "stats": [[list(k), s.to_state()] for k, s in self.items()],
        }

    @classmethod
    def from_state(cls, raw: dict[str, Any], max_keys: int = DEFAULT_MAX_KEYS) -> Aggregator:
        agg = cls(max_keys)
        agg.refused = int(raw.get("refused", 0))
        for k, s in raw.get("stats", []):
            agg._stats[Key(*k)] = Stats.from_state(s)
        return agg


def to_record(key: Key, st: Stats, nccl_default_time_us: float) -> RewardRecord:
    """The reward record of one key (`nccl_default_time_us`: the baseline's estimate)."""
    time_total = st.sum_us
    busbw = st.sum_bytes / (time_total * 1e3) * bus_factor(key.coll, key.nranks)
    p50 = st.quantile(0.5)
    p99 = max(st.quantile(0.99), p50)
    return RewardRecord(
        collective=collective_from_id(key.coll),
        size_bucket=key.bucket,
        nbytes_min=st.min_bytes,
        nbytes_max=st.max_bytes,
        nranks=key.nranks,
        nnodes=min(key.nnodes, key.nranks),
        algo=algo_from_id(key.algo),
        proto=proto_from_id(key.proto),
        nchannels=key.nchannels,
        chunk_bytes=key.chunk_bytes,
        origin=Origin(key.origin),
        user_tag=key.user_tag,
        count=st.count,
        mean_time_us=min(max(st.mean_us, MIN_TIME_US), MAX_TIME_US),
        p50_time_us=min(max(p50, MIN_TIME_US), MAX_TIME_US),
        p99_time_us=min(max(p99, MIN_TIME_US), MAX_TIME_US),
        busbw_GBps=min(busbw, 1e6),
        nccl_default_time_us=min(max(nccl_default_time_us, MIN_TIME_US), MAX_TIME_US),
    )
