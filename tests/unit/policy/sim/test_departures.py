"""Every departure from NCCL's model is scoped and cites existing measurements."""

from __future__ import annotations

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.sim.calibration_data import calibration_system, load_rows
from dynamiccl.policy.sim.departures import REGISTRY, active, by_id, release_table

AR, AG = Collective.ALLREDUCE, Collective.ALLGATHER


def test_every_departure_cites_at_least_two_calibration_rows() -> None:
    ids = {r.id for r in load_rows()}
    for d in REGISTRY:
        cited = [e for e in d.evidence if e in ids]
        assert len(cited) >= 2, d.id
        assert d.mechanism
        assert d.title


def test_nvls_small_team_scope() -> None:
    d = by_id("nvls-small-team")
    assert d.active(calibration_system("dgx-h200-5gpu"), AR)
    assert d.active(calibration_system("dgx-h200"), AR)
    assert not d.active(calibration_system("dgx-h200-4gpu"), AR)  # gains only above 4 GPUs
    assert not d.active(calibration_system("dgx-h200-5gpu"), AG)  # and only for all-reduce
    assert not d.active(calibration_system("azure-ndmv4-1node"), AR)


def test_efa_ll_scope() -> None:
    d = by_id("efa-ll")
    assert d.active(calibration_system("aws-p5-2node"), AR)
    assert not d.active(calibration_system("azure-ndmv4-2node"), AR)
    assert active(calibration_system("azure-ndmv4-2node"), AR) == ()


def test_release_table_only_when_the_pick_is_affected() -> None:
    table = release_table(calibration_system("aws-p5-2node"), AR)
    tree, ring = Algo.TREE.nccl_id, Algo.RING.nccl_id
    ll, ll128, simple = (p.nccl_id for p in Proto)
    assert table[tree, ll, ring, simple]  # NCCL picked LL: Simple may beat it
    assert table[tree, ll, tree, ll128]
    assert not table[tree, ll, ring, ll]  # LL itself is not released
    assert not table[tree, ll128, ring, simple]  # NCCL did not pick LL: nothing released
    nvls = release_table(calibration_system("dgx-h200-5gpu"), AR)
    assert nvls[ring, simple, Algo.NVLS.nccl_id, simple]
    assert nvls.sum() == 21  # any pick, only NVLS/Simple released
