"""The sidecar's pair probes: the (algorithm, protocol) pairs its table leaves out get a
look, gated by NCCL's estimate (online/probes.py), through `Tuning` as the sidecar runs it."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynamiccl.api.nccl import Algo, Proto
from dynamiccl.policy.online.tuner import TunerConfig, sidecar_setting
from dynamiccl.sidecar.tuning import Tuning
from tests.unit.sidecar.test_tuning import RING_SIMPLE, TIMES, FixedDefaults, base, play


class _ShapeModel:
    """Stand-in for NCCL's cost model of the shape: finite estimates for six (algo, proto)
    pairs (COLLNET and the rest infeasible), 32 channels at most."""

    def times(self, colls: list[int], sizes: list[float]) -> np.ndarray:
        t = np.full((len(colls), len(Algo), len(Proto)), np.inf)
        for (a, p), v in {
            (1, 1): 30.0,
            (1, 2): 24.0,
            (0, 2): 36.0,
            (0, 0): 38.0,
            (0, 1): 33.0,
            (4, 1): 80.0,
        }.items():
            t[:, a, p] = v
        return t

    def max_channels(self, algos: list[int]) -> np.ndarray:
        return np.full(len(algos), 32)


class ModelDefaults(FixedDefaults):
    def model(self, nranks: int, nnodes: int) -> Any:
        return _ShapeModel()


def test_the_sidecar_probes_every_allowed_pair_its_table_leaves_out() -> None:
    """The sidecar's tuning (`sidecar_setting`: `RaceConfig.probe_pairs` on): the table's
    arms are RING/LL128, RING/SIMPLE, TREE/SIMPLE and NCCL's NVLS; TREE/LL128, which the
    table leaves out, is the fastest (15.0). It becomes an arm at NCCL's channels (TREE/LL,
    not allowed by the policy, does not; nor do pairs NCCL's model cannot run, or whose
    estimate is more than `probe_reach` above the best pair's: NVLS/LL128 at 80 against
    24), gets a look and wins. Without the probes it is never tried."""
    tree_ll128, tree_ll, nvls_ll128 = (0, 1, 0, 0), (0, 0, 0, 0), (4, 1, 0, 0)
    allowed = frozenset((a, p) for a in (0, 1, 4) for p in (1, 2))

    def time_of(arm: tuple[int, int, int, int]) -> float:
        return 15.0 if arm[:2] == tree_ll128[:2] else TIMES.get((*arm[:2], 0, 0), 40.0)

    cfg = TunerConfig(budget_calls=400, refine=0.5)
    for probes, want in ((True, tree_ll128), (False, RING_SIMPLE)):
        c = sidecar_setting(cfg)
        assert c.race is not None
        assert c.race.probe_pairs
        if not probes:
            c = c.model_copy(update={"race": c.race.model_copy(update={"probe_pairs": False})})
        t = Tuning(base(), c, ModelDefaults(), channel_range=(1, 64), allowed_pairs=allowed)
        play(t, time_of, 400)
        (ct,) = t.cells.values()
        assert (tree_ll128 in ct.arms) is probes
        assert tree_ll not in ct.arms
        assert nvls_ll128 not in ct.arms  # allowed and runnable, but 80 / 24 > 1 + 2
        assert {a[:2] for a in ct.arms} <= allowed | {(4, 2)}  # NCCL's own pick stays an arm
        assert ct.arms[ct.tuner.chosen()][:2] == want[:2], probes
    # the same gate, wider: NVLS/LL128 is probed too
    wide = sidecar_setting(cfg)
    assert wide.race is not None
    wide = wide.model_copy(update={"race": wide.race.model_copy(update={"probe_reach": 3.5})})
    t = Tuning(base(), wide, ModelDefaults(), channel_range=(1, 64), allowed_pairs=allowed)
    play(t, time_of, 16)
    (ct,) = t.cells.values()
    assert nvls_ll128 in ct.arms
