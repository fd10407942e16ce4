"""When a measured choice still holds: none of the latest verdicts contradicts it (issue 29).

The one recency rule of the learning loop's findings (operator/learning/findings.py)
and of the retrain's training set (policy/train/store_data.py): a configuration some
jobs measured faster than NCCL's own choice stops holding as soon as one of the latest
`latest` jobs that measured it says otherwise (the surface changed back, a guardrail
reverted it), however many older jobs supported it. Neither a finding nor a retrained
model then keeps the old gain.
"""

from __future__ import annotations

from collections.abc import Sequence


def still_holds(supports: Sequence[bool], latest: int) -> bool:
    """`supports`: each job's verdict on the choice, oldest first (True: it supports the
    choice, False: it contradicts it). True when none of the latest `latest` contradicts."""
    if latest <= 0:
        raise ValueError(f"latest must be positive, got {latest}")
    return all(supports[-latest:])
