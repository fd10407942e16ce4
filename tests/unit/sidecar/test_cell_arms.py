"""One cell's arms and prior as the online tuner starts them (sidecar/cell_arms.py)."""

from __future__ import annotations

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.rewards import EventKind
from dynamiccl.api.table import WEIGHT_MAX, Candidate, Cell, Choice
from dynamiccl.sidecar.attribution import arm_of
from dynamiccl.sidecar.cell_arms import cell_arms, cell_event, cell_id

RING_LL128 = Choice(algo=Algo.RING, proto=Proto.LL128)
TREE_SIMPLE = Choice(algo=Algo.TREE, proto=Proto.SIMPLE)
RING_SIMPLE = Candidate(algo=Algo.RING, proto=Proto.SIMPLE, weight=100)
RING_LL = Candidate(algo=Algo.RING, proto=Proto.LL, weight=30)
NCCL_PICK = (Algo.NVLS.nccl_id, Proto.SIMPLE.nccl_id, 0, 0)


def cell(choices: tuple[Choice, ...] = (), candidates: tuple[Candidate, ...] = ()) -> Cell:
    return Cell(
        collective=Collective.ALLREDUCE, bucket=20, scale=3, choices=choices, candidates=candidates
    )


def test_the_first_choice_leads_then_the_candidates_by_weight_then_nccls_pick() -> None:
    arms, prior, default = cell_arms(
        cell((RING_LL128, TREE_SIMPLE), (RING_SIMPLE, RING_LL)), NCCL_PICK
    )
    assert arms == [arm_of(RING_LL128), arm_of(TREE_SIMPLE), arm_of(RING_SIMPLE), arm_of(RING_LL),
                    NCCL_PICK]  # fmt: skip
    assert prior == [200.0, 1.0, 100.0, 30.0, 1.0]  # first choice: twice the top candidate
    assert default == 4


def test_without_choices_nccls_pick_is_the_committed_arm() -> None:
    arms, prior, default = cell_arms(cell(candidates=(RING_SIMPLE, RING_LL)), NCCL_PICK)
    assert default == 2
    assert prior[default] == 2.0 * WEIGHT_MAX  # above every candidate
    # NCCL's pick already among the candidates: it takes the lead weight in place
    arms, prior, default = cell_arms(cell(candidates=(RING_SIMPLE, RING_LL)), arm_of(RING_LL))
    assert arms == [arm_of(RING_SIMPLE), arm_of(RING_LL)]
    assert default == 1
    assert prior == [100.0, 200.0]


def test_no_model_no_default_arm_and_no_duplicates() -> None:
    arms, prior, default = cell_arms(
        cell((RING_LL128,), (Candidate(algo=Algo.RING, proto=Proto.LL128, weight=5), RING_LL)),
        None,
    )
    assert arms == [arm_of(RING_LL128), arm_of(RING_LL)]
    assert prior == [60.0, 30.0]
    assert default is None


def test_an_event_names_its_cells_byte_range() -> None:
    c = cell()
    ev = cell_event(c, EventKind.CHANGE_DETECTED, 1234, "x" * 300)
    assert (ev.nbytes_min, ev.nbytes_max) == (1 << 20, (2 << 20) - 1)
    assert ev.call_index == 1234
    assert len(ev.message) == 256
    assert cell_id(c) == (3, Collective.ALLREDUCE.nccl_id, 20)
