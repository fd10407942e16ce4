"""The race: verdicts on measured arms, the prior's gate, the channel ladders, the tail."""

from __future__ import annotations

import math

import numpy as np

from dynamiccl.api.nccl import Collective
from dynamiccl.policy.online.bandit import ArmStats
from dynamiccl.policy.online.commit import final_choice
from dynamiccl.policy.online.plan import race_candidates
from dynamiccl.policy.online.race import RaceConfig, channel_ladder, race
from dynamiccl.policy.online.tuner import BucketTuner, CellKey, TunerConfig, cell_tuner


def stats(*samples: list[float]) -> list[ArmStats]:
    out = []
    for xs in samples:
        s = ArmStats()
        for x in xs:
            s.add(math.log(x))
        out.append(s)
    return out


def test_clearly_slower_arms_are_out_close_ones_stay_open() -> None:
    st = stats([100.0] * 20, [130.0, 131.0], [101.0, 100.5], [])
    r = race(st, [True] * 4, 0.04, RaceConfig())
    assert r.leader == 0
    assert r.out == (1,)
    assert [i for i, _ in r.wants] == [2, 3]  # open first, then the unmeasured


def test_an_arm_that_cannot_beat_the_leader_by_the_indifference_is_settled() -> None:
    st = stats([100.0] * 400, [100.2] * 400)
    r = race(st, [True, True], 0.04, RaceConfig(indifference=0.01))
    assert r.out == ()
    assert r.wants == ()  # settled: not worth more calls


def test_the_prior_gate_and_the_ladder_choose_the_looks() -> None:
    groups = ["a"] * 5 + ["b"]
    ladder = channel_ladder(groups, [None, 1, 2, 4, 8, None])
    assert ladder[:5] == [("a", None), ("a", 0), ("a", 1), ("a", 2), ("a", 3)]
    st = stats([100.0] * 10, [], [], [], [], [])
    ok = [True, False, False, False, False, False]  # the prior admits group a only
    r = race(st, [True] * 6, 0.04, RaceConfig(), admissible=ok, ladder=ladder)
    # group a's middle and top rungs (2, 4 and 8 channels), never 1 channel; b not admitted
    assert sorted(i for i, _ in r.wants) == [2, 3, 4]
    st = stats([100.0] * 10, [], [], [], [300.0] * 3, [])
    r = race(st, [True] * 6, 0.04, RaceConfig(), admissible=ok, ladder=ladder)
    assert r.out == (4,)
    assert sorted(i for i, _ in r.wants) == [2, 3]  # 8 channels far out: no walk past it


def test_race_candidates_commit_calls_to_a_new_leader_first() -> None:
    st = stats([100.0] * 10, [90.0] * 3, [])
    r = race(st, [True] * 3, 0.04, RaceConfig())
    cands, explore = race_candidates(r, committed=0, epoch_calls=16, explore_budget=1.0)
    assert cands[0][0] == 1
    assert 0 < explore <= 1
    assert race_candidates(r, 0, 16, explore_budget=0.0)[1] == 0.0


def _drive(t: BucketTuner, means: list[float], calls: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    played = []
    for j in range(calls):
        a = t.arm_for_call(j)
        played.append(a)
        t.observe(a, means[a] * float(np.exp(rng.normal(0, 0.04))))
        if (j + 1) % t.cfg.epoch_calls == 0:
            t.end_epoch()
    return played


def test_a_slow_favourite_loses_the_prior_its_trust() -> None:
    """The prior's first choice is 25 % slower than a pair it ranked 5th: once its first
    choice is out, the gate opens and the race reaches the 5th pair."""
    means = [125.0, 140.0, 150.0, 160.0, 100.0]
    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 20)
    t = cell_tuner(list("abcde"), [None] * 5, [1.0, 0.1, 0.05, 0.02, 1e-6], None,
                   cfg=TunerConfig(), key=key)  # fmt: skip
    _drive(t, means, 200, 0)
    assert t.chosen() == 4


def test_exploration_ends_and_costs_little_with_a_right_prior() -> None:
    means = [100.0, 130.0, 160.0, 200.0, 400.0, 800.0]
    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 20)
    prior = [1.0, 0.3, 0.1, 0.01, 1e-4, 1e-6]
    t = cell_tuner(list("abcdef"), [None] * 6, prior, None, cfg=TunerConfig(), key=key)
    played = _drive(t, means, 400, 1)
    assert t.chosen() == 0
    assert not t.exploring  # the winner is clear: no more looks
    cost = np.mean([means[a] for a in played]) / 100.0 - 1
    spread = np.mean(means) / 100.0 - 1  # what uniform exploration would cost
    assert cost < 0.1 * spread


def test_the_final_choice_is_not_a_lucky_arm_with_one_call() -> None:
    """Exploration ends: one call 3 % below a well-measured arm does not win, a dozen
    6 % below do."""
    lucky = stats([97.0], [100.0] * 40)
    assert final_choice(lucky, [True, True], 0.04, RaceConfig()) == 1
    clear = stats([94.0] * 12, [100.0] * 40)
    assert final_choice(clear, [True, True], 0.04, RaceConfig()) == 0
    assert final_choice(stats([], []), [True, True], 0.04, RaceConfig()) is None
    # two calls 8 % below: still a look, not a choice (`final_calls` 3); alone it is taken
    two = stats([92.0, 92.0], [100.0] * 40)
    assert final_choice(two, [True, True], 0.04, RaceConfig()) == 1
    assert final_choice(two, [True, True], 0.04, RaceConfig(final_calls=2)) == 0
    assert final_choice(stats([92.0, 92.0]), [True], 0.04, RaceConfig()) == 0


def test_a_lucky_look_is_not_committed_mid_race_it_gets_calls_first() -> None:
    """The committed arm measures clearly slower; the lowest mean is one call: the tuner
    commits the well-measured runner-up (`final_choice`'s rule) and gives the one-call
    leader calls, so a sidecar never runs a whole table round on a look that won by luck."""
    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 20)
    cfg = TunerConfig(epoch_calls=16, budget_calls=400)
    t = cell_tuner(list("abc"), [None] * 3, [1.0, 0.5, 0.3], None, cfg=cfg, key=key)
    for _ in range(20):
        t.observe(0, 130.0)  # the prior's favourite: 30 % slower
    for y in (100.0, 101.0, 99.0, 100.0, 100.0, 102.0):
        t.observe(1, y)
    t.observe(2, 95.0)  # one call, the lowest mean
    t.end_epoch()
    assert t.committed == 1
    assert 2 in {i for i, _ in t.plan.candidates}
    for _ in range(2):
        t.observe(2, 95.0)  # three calls: now it is a choice
    t.end_epoch()
    assert t.committed == 2


def test_a_long_last_epoch_still_looks_a_short_one_does_not() -> None:
    """In the budget's last epoch a first look could not be followed up: short epochs
    (bench tune's 16 calls) leave them out; a 64-call last epoch is a third of the
    budget, so it still looks, with an open arm's share, and the final choice (at
    least `final_calls` calls) judges what it finds."""
    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 20)
    for epoch, looks in ((16, False), (64, True)):
        cfg = TunerConfig(epoch_calls=epoch, budget_calls=2 * epoch + 8)
        t = cell_tuner(list("abcd"), [None] * 4, [1.0, 0.5, 0.3, 0.2], None, cfg=cfg, key=key)
        for _ in range(2):  # two epochs on arm a only: the others still unmeasured
            for _ in range(epoch):
                t.observe(0, 100.0)
            t.end_epoch()
        fresh = {i for i, _ in t.plan.candidates if t.stats[i].n == 0}
        assert bool(fresh) is looks, (epoch, t.plan)
        if looks:
            share = {w for i, w in t.plan.candidates if i in fresh}
            assert share == {max(w for _, w in t.plan.candidates)}  # an open arm's share


def test_the_tuner_ends_on_the_best_measured_arm_when_its_budget_is_spent() -> None:
    """Hysteresis keeps the committed arm while exploring; once the budget is spent the
    final choice is what the measurements say, not the arm committed first."""
    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 20)
    means = [103.0, 100.0, 140.0]
    cfg = TunerConfig(budget_calls=160)
    wins = 0
    for seed in range(6):
        t = cell_tuner(list("abc"), [None] * 3, [1.0, 0.5, 0.1], None, cfg=cfg, key=key)
        _drive(t, means, 160, seed)
        assert t.budget_spent
        assert not t.exploring
        wins += t.chosen() == 1
    assert wins >= 5


def test_a_best_pair_the_prior_ranks_last_is_reached_through_its_neighbours() -> None:
    """The prior ranks the pairs as (ring, ll) > (ring, ll128) > (tree, ll) > (ring,
    simple) > (tree, simple) > (tree, ll128); the last is fastest and the two before it
    measure far out, so the prior's order alone stops before it. It is a coordinate
    neighbour (the algorithm changed) of the second best measured pair (ring, ll128)."""
    groups = [("ring", "ll"), ("ring", "ll128"), ("tree", "ll"), ("ring", "simple"),
              ("tree", "simple"), ("tree", "ll128")]  # fmt: skip
    means = [108.0, 130.0, 315.0, 290.0, 166.0, 100.0]
    prior = [1.0, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7]
    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 19)
    for seed in range(4):
        t = cell_tuner(groups, [None] * 6, prior, None, cfg=TunerConfig(budget_calls=200), key=key)
        _drive(t, means, 200, seed)
        assert t.chosen() == 5, seed


def test_near_equal_channel_counts_are_resolved_to_the_best() -> None:
    """A perturbed surface's pair (h100-nvls, broadcast 8 B): every channel count within
    4 % of the others, 1 channel the fastest, at the far end of the ladder, two other
    pairs far out. Rungs near the leader share the epochs with it, so the walk reaches
    1 channel and the race tells it apart from 16 and 32 channels (2 % slower)."""
    channels: list[int | None] = [None, 1, 2, 4, 8, 12, 16, 24, 32, None, None]
    groups = ["a"] * 9 + ["b", "c"]
    means = [104.3, 100.0, 103.6, 103.8, 103.3, 103.8, 102.3, 103.9, 102.0, 213.0, 156.0]
    prior = [1.0] + [1e-9] * 8 + [1e-6, 1e-8]
    key = CellKey(1, 0, 8, 1, Collective.BROADCAST, 3)
    for seed in range(10):
        t = cell_tuner(groups, channels, prior, 0, cfg=TunerConfig(budget_calls=200), key=key)
        _drive(t, means, 208, seed)
        assert t.chosen() == 1, seed


def test_pair_probes_reach_a_best_pair_the_tail_and_the_neighbours_miss() -> None:
    """`probe_pairs` (the sidecar's setting): the prior ranks the fastest pair (tree,
    simple) last, the two pairs before it measure far out (the tail stops) and it is no
    coordinate neighbour of the two best measured pairs. Without probes the race never
    looks at it; with them it gets one look, wins, and each far-out pair costs a look."""
    groups = [("ring", "ll"), ("ring", "ll128"), ("tree", "ll"), ("ring", "simple"),
              ("tree", "ll128"), ("tree", "simple")]  # fmt: skip
    means = [108.0, 125.0, 315.0, 290.0, 260.0, 100.0]
    prior = [1.0, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7]
    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 19)
    plain_cfg = TunerConfig(budget_calls=200, race=RaceConfig(tail_misses=2))
    probing = TunerConfig(budget_calls=200, race=RaceConfig(tail_misses=2, probe_pairs=True))
    for seed in range(4):
        plain = cell_tuner(groups, [None] * 6, prior, None, cfg=plain_cfg, key=key)
        _drive(plain, means, 200, seed)
        assert plain.stats[5].n == 0, seed
        t = cell_tuner(groups, [None] * 6, prior, None, cfg=probing, key=key)
        played = _drive(t, means, 200, seed)
        assert t.chosen() == 5, seed
        assert sum(a in (2, 3, 4) for a in played) <= 6, seed


def test_the_tail_goes_on_past_two_far_out_pairs() -> None:
    """The default tail stops after three far-out pairs in a row, not two: the same
    cell as above (the fastest pair last, behind two far-out ones) ends on it without
    probes, at one look per far-out pair."""
    groups = [("ring", "ll"), ("ring", "ll128"), ("tree", "ll"), ("ring", "simple"),
              ("tree", "ll128"), ("tree", "simple")]  # fmt: skip
    means = [108.0, 125.0, 315.0, 290.0, 260.0, 100.0]
    prior = [1.0, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7]
    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 19)
    for seed in range(4):
        t = cell_tuner(groups, [None] * 6, prior, None, cfg=TunerConfig(budget_calls=200), key=key)
        played = _drive(t, means, 200, seed)
        assert t.chosen() == 5, seed
        assert sum(a in (2, 3, 4) for a in played) <= 6, seed


def test_another_group_gets_a_look_before_the_committed_groups_ladder() -> None:
    """Nothing measured, the committed arm's group (a) first in the prior's order with two
    rungs: the first look goes to group b, whose arm the prior ranks after a's rungs."""
    ladder = channel_ladder(["a", "a", "a", "b"], [None, 4, 8, None])
    st = stats([], [], [], [])
    r = race(st, [True] * 4, 0.04, RaceConfig(), ladder=ladder, committed=0)
    assert r.wants[0][0] == 3  # before: 0, 1, 2 (a) first, in index order


def test_nccls_group_keeps_its_ladder_while_only_its_count_is_far_out() -> None:
    """NCCL's count of pair a measured 2x slower than pair b: without `default` pair a is
    dropped; as NCCL's pick's group its middle and top rungs still get a look (NCCL may
    have misjudged only the channel count)."""
    ladder = channel_ladder(["a", "a", "a", "a", "b"], [None, 2, 8, 32, None])
    st = stats([200.0] * 8, [], [], [], [100.0] * 8)
    every = [True] * 5
    dropped = race(st, every, 0.04, RaceConfig(), ladder=ladder)
    kept = race(st, every, 0.04, RaceConfig(), ladder=ladder, default=0)
    assert not {1, 2, 3} & {i for i, _ in dropped.wants}
    assert {2, 3} <= {i for i, _ in kept.wants}
