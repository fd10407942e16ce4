"""How often the sidecar cuts a reward batch: the job's size and the ingest's answers decide.

A sidecar cuts a batch every `interval()` seconds (or when a batch is full,
`MAX_RECORDS_PER_BATCH` records). Between two cuts every call of one shape and
choice folds into one record, so a longer interval sends fewer batches *and*
fewer records for the same calls: nothing measured is dropped, it is summed.

- Job size: a job's pods together cut at most `JOB_BATCHES_PER_S` batches a
  second, so the interval is at least ``pods / JOB_BATCHES_PER_S`` (a 2 000-pod
  job: 20 s; a 12 500-pod job: 125 s), never below `--flush-interval`.
- The ingest's answers: a 429 or 503 (the endpoint over its rate limit or its
  store's capacity, with `Retry-After`) doubles the interval, up to
  `MAX_INTERVAL_S` (30 min); every acknowledged batch takes a fifth of the stretch back
  (AIMD, as TCP does), so a cluster of sidecars settles at what the ingest
  replicas can store.
"""

from __future__ import annotations

from typing import Final

DEFAULT_FLUSH_S: Final = 2.0  # --flush-interval's default
JOB_BATCHES_PER_S: Final = 100.0
MAX_INTERVAL_S: Final = 1800.0
OVERLOADED: Final = frozenset({429, 503})
RELAX: Final = 1.25  # an acknowledged batch divides the stretch by this


class Pace:
    """The cut interval of one sidecar."""

    def __init__(
        self,
        base_s: float,
        pods: int,
        *,
        job_batches_per_s: float = JOB_BATCHES_PER_S,
        max_s: float = MAX_INTERVAL_S,
    ) -> None:
        self.max_s = max(max_s, base_s)
        self.floor_s = min(self.max_s, max(base_s, pods / job_batches_per_s))
        self.stretch = 1.0

    def interval(self) -> float:
        """Seconds between two cuts now."""
        return min(self.max_s, self.floor_s * self.stretch)

    def observe(self, status: int, retry_after_s: float | None) -> None:
        """Adapt to one answer of the ingest (status 0: no answer, which changes nothing:
        the endpoint may be down, not busy)."""
        if status in OVERLOADED:
            top = self.max_s / self.floor_s if self.floor_s > 0 else 1.0
            want = 2.0 * self.stretch
            if retry_after_s is not None and self.floor_s > 0:
                want = max(want, retry_after_s / self.floor_s)
            self.stretch = min(top, want)
        elif status == 200:
            self.stretch = max(1.0, self.stretch / RELAX)
