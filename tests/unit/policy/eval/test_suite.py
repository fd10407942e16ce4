"""The benchmark suite: coverage of the brief, honest aggregates, plots."""

from __future__ import annotations

import numpy as np

from dynamiccl.api.topology import Fabric, Intra
from dynamiccl.policy.eval.suite import SIZES, run_suite, suite_specs
from dynamiccl.policy.runtime.encode import JobContext
from dynamiccl.policy.train.inference import new_policy

POLICY = new_policy(0, hidden=16)
POLICY.net.eval()


def test_suite_covers_what_the_brief_lists() -> None:
    specs = [s for _, s in suite_specs()]
    assert len(specs) >= 10
    assert len({s.name for s in specs}) == len(specs)
    single = [s for s in specs if s.nodes == 1]
    assert any(s.intra is Intra.NVSWITCH and s.nvls for s in single)
    assert any(s.intra is Intra.NVSWITCH and not s.nvls for s in single)
    assert any(s.intra is Intra.PCIE for s in single)
    multi = [s for s in specs if s.nodes > 1]
    assert {s.fabric for s in multi} >= {Fabric.INFINIBAND, Fabric.ROCE, Fabric.EFA}
    assert min(s.nodes for s in multi) == 2
    assert max(s.nodes for s in multi) == 64
    assert any(s.sharp for s in multi)
    assert any(JobContext.of(s).system.container_split for s in specs)
    assert SIZES[0] == 8
    assert SIZES[-1] == 16 << 30


def test_run() -> None:
    rep = run_suite(POLICY, budget=32, names=["h200x5-nvls", "p5-efa-4n"], sizes=(1 << 12, 1 << 30))
    assert [t.name for t in rep.topologies] == ["h200x5-nvls", "p5-efa-4n"]
    for t in rep.topologies:
        assert len(t.calls) == 10
        for c in t.calls:
            assert c.oracle_us <= c.nccl_us * (1 + 1e-9)
            assert c.oracle_us <= c.static_us * (1 + 1e-9)
            assert c.tuned_us is not None
            assert c.oracle_us <= c.tuned_us * (1 + 1e-9)
    # Aggregates are geometric means of the per-call ratios.
    calls = [c for t in rep.topologies for c in t.calls]
    geo = float(np.exp(np.mean([np.log(c.nccl_us / c.static_us) for c in calls])))
    assert abs(rep.static.speedup - geo) < 1e-9
    assert rep.tuned is not None
    assert set(rep.targets) == {
        "differ_speedup>=1.2",
        "oracle_fraction>=0.97",
        "never_below_default_by_2pct",
    }
    assert "OVERALL" in rep.summary()
