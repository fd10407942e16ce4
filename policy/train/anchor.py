"""Where the store's experience says nothing, a fine-tune keeps its parent's choices.

The offline update (offline.py) moves one shared network: advantage-weighted steps on
the cells the jobs measured move its choices in cells nobody measured too. Measured on
the harness-played cluster (docs/benchmarks.md, "Cross-job learning"): a retrain on
all-reduce rows dropped the parent's all-gather choice in a 16 MiB cell no row
covered, 5 % slower inside its canary jobs, and the judge rolled the version back; the
finding it was retrained for reached every job, the model never got promoted.

`anchor_points` lists, for every communicator the rows come from, the observations of
every collective and size bucket those rows do not cover (nor cover with a gain that
waits for confirmation, which the encoder leaves out: there too the parent's choice
stands). `parent_actions` is the network's own greedy choice there before the update;
`anchor_loss` is the negative log-probability of those choices, which the update adds
(`OfflineConfig.anchor` times it), so the fine-tune learns where the rows are and
stays where they are not. No library does this; it is a term of our own loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from dynamiccl.api.nccl import Collective
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.runtime.ranker import Ranker
from dynamiccl.policy.runtime.space import ActionLimits
from dynamiccl.policy.train.inference import Policy, trunk_out
from dynamiccl.policy.train.store_data import TrainingData, communicator

BUCKETS = range(35)  # 1 B .. 16 GiB, one point in the middle of each power-of-two bucket


@dataclass(frozen=True)
class Anchors:
    """Observations and joint feasibility of the points the rows do not cover."""

    obs: NDArray[np.float32]
    feasible: NDArray[np.bool_]


def anchor_points(
    data: TrainingData, ranker: Ranker, limits: ActionLimits | None = None
) -> Anchors | None:
    """Every (collective, size bucket) of each communicator in `data` without a row."""
    pending = {p for p, act in data.calls if data.weight((p, act)) <= 0.0}  # encode's rule
    covered: dict[tuple[str, int, int], set[tuple[int, int]]] = {}
    for point, _act in data.calls:
        cells = covered.setdefault(point[:3], set())
        if point not in pending:
            cells.add((point[3], point[4] // 8))
    obs, feas = [], []
    for (fkey, nranks, nnodes), cells in covered.items():
        todo = [(c.nccl_id, b) for c in Collective for b in BUCKETS if (c.nccl_id, b) not in cells]
        if not todo:
            continue
        try:
            dec = Decider.of(ranker, communicator(data.features[fkey], nranks, nnodes), limits)
            o, f, _ = dec.inputs(
                np.array([c for c, _ in todo], dtype=np.int64),
                np.array([2.0 ** (b + 0.5) for _, b in todo]),
            )
        except ValueError:
            continue  # the encoder counts these rows as skipped
        keep = f.reshape(len(todo), -1).any(-1)
        obs.append(o[keep])
        feas.append(f[keep])
    if not obs or not sum(len(o) for o in obs):
        return None
    o, f = np.concatenate(obs).astype(np.float32), np.concatenate(feas)
    # jobs of one hardware class observe the same points: each once
    first = {row.tobytes(): i for i, row in reversed(list(enumerate(o)))}
    keep = np.array(sorted(first.values()))
    return Anchors(o[keep], f[keep])


def parent_actions(policy: Policy, anchors: Anchors) -> torch.Tensor:
    """The network's greedy joint action at every anchor point, before the update."""
    net = policy.net
    with torch.no_grad():
        h = trunk_out(net, anchors.obs)
        step = net.act(h, torch.from_numpy(anchors.feasible), greedy=True)
    return step.actions


def anchor_loss(
    policy: Policy, anchors: Anchors, actions: torch.Tensor, idx: torch.Tensor
) -> torch.Tensor:
    """Mean negative log-probability of the parent's choices at the points `idx`."""
    net = policy.net
    at = idx.numpy()
    h = trunk_out(net, anchors.obs[at])
    step = net.act(h, torch.from_numpy(anchors.feasible[at]), actions=actions[idx])
    return -step.log_prob.mean()
