"""The numpy policy decides like the torch policy: same actions, same probabilities, same tables.

Inputs come from the real compile path (`Decider.inputs`: observations,
feasibility and NCCL's pick) on suite and calibration topologies, with and
without constraints, plus random feasibility masks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import Mode, NCCLTuningPolicySpec
from dynamiccl.policy.eval.suite import suite_specs
from dynamiccl.policy.runtime.compile import BUCKETS, compile_table
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ, state_shapes
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy, _topk
from dynamiccl.policy.runtime.space import HEADS, ActionLimits
from dynamiccl.policy.sim.calibration_data import load_system_specs
from dynamiccl.policy.train.inference import Policy, new_policy
from tests.topology_samples import h100_job

Inputs = tuple[np.ndarray, np.ndarray, np.ndarray]
RTOL = 1e-5
# Below this, float32 log-probabilities (|log p| > 20) resolve p only to a few 1e-6
# relative per ulp: compare those in log space.
TAIL = 1e-9
CONSTRAINED = ActionLimits(
    algos=frozenset({Algo.RING, Algo.TREE, Algo.NVLS}),
    protos=frozenset({Proto.LL, Proto.SIMPLE}),
    min_channels=2,
    max_channels=16,
)


def _specs() -> list[TopologySpec]:
    suite = {s.name: s for _, s in suite_specs()}
    calib = load_system_specs()
    names = ("h100-nvls", "h200x5-nvls", "l40s-pcie", "h100-ib-2n", "p4d-efa-16n", "b200-ib-8n")
    picked = [suite[n] for n in names] + [suite["h100-sharp-16n"], suite["a100-container"]]
    return [*picked, calib["aws-p5-2node"], calib["azure-ndmv4-1node"], calib["dgx-h200-6gpu"]]


def _real_inputs(policy: Any) -> Inputs:
    """Calls at compile's bucket midpoints and at random sizes, every collective."""
    rng = np.random.default_rng(7)
    obs, feas, picks = [], [], []
    for i, spec in enumerate(_specs()):
        for limits in (ActionLimits(), CONSTRAINED):
            decider = Decider.of(policy, spec, limits)
            buckets = rng.choice(np.array(list(BUCKETS)), 4, replace=False)
            sizes = np.concatenate([2.0 ** (buckets + 0.5), 2.0 ** rng.uniform(3, 36, 3)])
            colls = np.repeat(np.arange(len(Collective)), len(sizes))
            o, f, p = decider.inputs(colls, np.tile(sizes, len(Collective)))
            keep = rng.random(len(o)) < (0.6 if i % 2 else 0.4)
            obs.append(o[keep])
            feas.append(f[keep])
            picks.append(p[keep])
    return np.concatenate(obs), np.concatenate(feas), np.concatenate(picks)


def _random_masks(inputs: Inputs, seed: int) -> Inputs:
    """The same calls under random feasibility (at least one feasible action per row)."""
    obs, _f, pick = inputs
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(obs), 200, replace=False)
    mask = rng.random((200, *HEADS.as_tuple())) < rng.choice([0.02, 0.2, 0.6], (200, 1, 1, 1, 1))
    flat = mask.reshape(200, -1)
    empty = ~flat.any(-1)
    flat[empty, rng.integers(0, flat.shape[1], empty.sum())] = True
    return obs[rows], mask, pick[rows]


@pytest.fixture(scope="module")
def shipped() -> tuple[Policy, NumpyPolicy]:
    tp, npp = Policy.load(), NumpyPolicy.load(DEFAULT_NPZ)
    assert len(npp.peers) == len(tp.peers)  # the seed ensemble travels in both formats
    return tp, npp


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Policy, NumpyPolicy]:
    pol = new_policy(11)
    pol.net.eval()
    path = tmp_path_factory.mktemp("fresh") / "m.npz"
    pol.export_npz(path)
    return pol, NumpyPolicy.load(path)


@pytest.fixture(scope="module")
def inputs(shipped: tuple[Policy, NumpyPolicy]) -> Inputs:
    return _real_inputs(shipped[1])


def _assert_probs_close(actual: np.ndarray, desired: np.ndarray) -> None:
    """Within RTOL relative; tail probabilities (< TAIL) within float32 log-space precision."""
    np.testing.assert_array_equal(actual == 0, desired == 0)
    big = desired >= TAIL
    np.testing.assert_allclose(actual[big], desired[big], rtol=RTOL, atol=0)
    tail = (desired > 0) & ~big
    np.testing.assert_allclose(np.log(actual[tail]), np.log(desired[tail]), rtol=1e-6, atol=1e-5)


def _check_decide(tp: Policy, npp: NumpyPolicy, data: Inputs) -> None:
    obs, f, pick = data
    assert npp.tau == tp.tau
    for p, tau in ((pick, 0.8), (pick, 0.99), (pick, 0.0), (None, 0.8), (pick, None)):
        a1, p1 = tp.decide(obs, f, p, tau)
        a2, p2 = npp.decide(obs, f, p, tau)
        assert a2.dtype == np.int64
        assert p2.dtype == np.float64
        assert a2.shape == a1.shape
        assert p2.shape == p1.shape
        np.testing.assert_array_equal(a2, a1)
        _assert_probs_close(p2, p1)
    np.testing.assert_array_equal(npp.greedy(obs, f), tp.greedy(obs, f))


def _check_top(tp: Policy, npp: NumpyPolicy, data: Inputs, k: int) -> None:
    obs, f, pick = data
    a1, p1 = tp.top_actions(obs, f, k, pick)
    a2, p2 = npp.top_actions(obs, f, k, pick)
    assert a2.dtype == np.int64
    assert p2.dtype == np.float64
    assert a2.shape == a1.shape == (len(obs), k, 4)
    assert p2.shape == p1.shape
    _assert_probs_close(p2, p1)
    np.testing.assert_array_equal(a2[:, 0], a1[:, 0])  # the decision itself
    # Elsewhere the same action, except among candidates whose float32 log-probs tie
    # to the last bit or two (deep in the tail): then numpy's pick must be exactly as
    # probable under the torch model, and such swaps stay rare.
    swapped = np.argwhere((a1 != a2).any(-1) & (p1 > 0))
    for r, j in swapped:
        joint = tp.joint_log_probs(obs[r : r + 1], f[r : r + 1])[0]
        _assert_probs_close(
            np.exp(joint[tuple(a2[r, j])].astype(np.float64))[None], p1[r, j : j + 1]
        )
    assert len(swapped) <= max(2, a1.shape[0] * k // 500), swapped


@pytest.mark.parametrize("model", ["shipped", "fresh"])
def test_decisions_match_torch_on_real_inputs(
    model: str, request: pytest.FixtureRequest, inputs: Inputs
) -> None:
    tp, npp = request.getfixturevalue(model)
    assert 300 <= len(inputs[0]) <= 800
    _check_decide(tp, npp, inputs)
    _check_top(tp, npp, inputs, 8)  # compile's MAX_CHOICES + MAX_CANDIDATES
    _check_top(tp, npp, inputs, 3)


@pytest.mark.parametrize("model", ["shipped", "fresh"])
def test_decisions_match_torch_under_random_feasibility(
    model: str, request: pytest.FixtureRequest, inputs: Inputs
) -> None:
    tp, npp = request.getfixturevalue(model)
    for seed in (1, 2):
        data = _random_masks(inputs, seed)
        _check_decide(tp, npp, data)
        _check_top(tp, npp, data, 8)


@pytest.mark.parametrize("model", ["shipped", "fresh"])
def test_joint_log_probs_match_torch(
    model: str, request: pytest.FixtureRequest, inputs: Inputs
) -> None:
    tp, npp = request.getfixturevalue(model)
    obs, f, _ = inputs
    j1 = tp.joint_log_probs(obs[:40], f[:40])
    j2 = npp.joint_log_probs(obs[:40], f[:40])
    assert j2.dtype == np.float32
    np.testing.assert_array_equal(np.isfinite(j2), f[:40])
    _assert_probs_close(
        np.exp(j2[f[:40]].astype(np.float64)), np.exp(j1[f[:40]].astype(np.float64))
    )


def _job_features(nodes: int, tp_degree: int) -> StateFeatures:
    return StateFeatures.model_validate(
        h100_job(
            nodes,
            "h100",
            workload={"parallelism": "3d", "degrees": {"tp": tp_degree, "pp": 1, "dp": 1}},
        )
    )


JOBS: list[tuple[str, StateFeatures | TopologySpec, dict[str, Any]]] = [
    ("1 node, learned", _job_features(1, 8), {"mode": "learned"}),
    ("4 nodes tp 4, static", _job_features(4, 4), {"mode": "static"}),
    (
        "4 nodes, constrained",
        _job_features(4, 8),
        {"mode": "learned", "constraints": {"allowedProtocols": ["ll", "simple"]}},
    ),
    ("efa 16 nodes", {s.name: s for _, s in suite_specs()}["p4d-efa-16n"], {}),
]


@pytest.mark.parametrize("model", ["shipped", "fresh"])
@pytest.mark.parametrize(("name", "job", "spec"), JOBS, ids=[j[0] for j in JOBS])
def test_compiled_tables_are_identical(
    model: str,
    name: str,
    job: StateFeatures | TopologySpec,
    spec: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    tp, npp = request.getfixturevalue(model)
    pol = NCCLTuningPolicySpec.model_validate(spec)
    with_torch = compile_table(tp, job, pol, version=3)
    with_numpy = compile_table(npp, job, pol, version=3)
    if pol.mode is Mode.LEARNED:  # static tables may agree with NCCL everywhere: no cells
        assert with_numpy.cells, name
    assert with_numpy.digest == with_torch.digest
    assert with_numpy.model_dump(mode="json") == with_torch.model_dump(mode="json")


def test_weight_shapes_follow_the_torch_network(tmp_path: Path) -> None:
    pol = new_policy(0, hidden=24)
    expected = {k: tuple(v.shape) for k, v in pol.net.state_dict().items()}
    assert state_shapes(pol.net.config()) == expected
    pol.meta = {"seed": 0, "note": "x"}
    pol.export_npz(tmp_path / "m.npz", source_sha256="ab" * 32)
    back = NumpyPolicy.load(tmp_path / "m.npz")
    assert back.meta == pol.meta
    assert back.source_sha256 == "ab" * 32
    assert back.config == pol.net.config()


@pytest.mark.parametrize("width", [5, 21, 72, 81])
def test_top_k_is_a_stable_descending_sorts_first_k(width: int) -> None:
    """The beam's top-k (argmax passes for wide rows) orders exactly as numpy's stable
    argsort of -x: ties by the lower index, -0.0 with 0.0, -inf and NaN last."""
    rng = np.random.default_rng(width)
    x = np.round(rng.standard_normal((2000, width)), 1).astype(np.float32)  # many ties
    x[rng.random(x.shape) < 0.2] = -np.inf
    x[rng.random(x.shape) < 0.02] = np.nan
    x[rng.random(x.shape) < 0.05] = np.float32(-0.0)
    x[0] = -np.inf
    for k in (1, 4, min(9, width)):
        vals, idx = _topk(x, k)
        ref = np.argsort(-x, axis=-1, kind="stable")[:, :k]
        assert np.array_equal(idx, ref)
        assert np.array_equal(vals, np.take_along_axis(x, ref, -1), equal_nan=True)
