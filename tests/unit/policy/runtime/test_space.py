"""Action heads and joint feasibility masks."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.api.nccl import Algo, Proto
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.runtime.space import (
    CHANNEL_OPTIONS,
    CHUNK_OPTIONS,
    HEADS,
    ActionLimits,
    channel_index,
    joint_mask,
    to_choice,
)

SIMPLE, LL = Proto.SIMPLE.nccl_id, Proto.LL.nccl_id


def test_heads_match_options() -> None:
    assert HEADS.as_tuple() == (7, 3, len(CHANNEL_OPTIONS), len(CHUNK_OPTIONS))
    assert CHANNEL_OPTIONS[0] == 0
    assert CHUNK_OPTIONS[0] == 0


def test_joint_mask_follows_pairs_and_chunk_only_for_simple() -> None:
    ap = np.zeros((7, 3), dtype=bool)
    ap[Algo.RING.nccl_id, SIMPLE] = True
    ap[Algo.TREE.nccl_id, LL] = True
    j = joint_mask(ap)
    assert j.shape == (7, 3, len(CHANNEL_OPTIONS), len(CHUNK_OPTIONS))
    assert j[Algo.RING.nccl_id, SIMPLE].all()  # every channel x chunk
    assert j[Algo.TREE.nccl_id, LL, :, 0].all()
    assert not j[Algo.TREE.nccl_id, LL, :, 1:].any()  # LL has no chunk choice
    assert not j[Algo.NVLS.nccl_id].any()


def test_limits_restrict_channels_and_chunks_but_keep_defaults() -> None:
    lim = ActionLimits(min_channels=4, max_channels=16, max_chunk=256 * 1024)
    ap = np.ones((2, 7, 3), dtype=bool)
    j = joint_mask(ap, lim)
    ch_ok = [n == 0 or 4 <= n <= 16 for n in CHANNEL_OPTIONS]
    assert (j[0, 1, SIMPLE, :, 0] == np.array(ch_ok)).all()
    ck_ok = [k == 0 or k <= 256 * 1024 for k in CHUNK_OPTIONS]
    assert (j[1, 1, SIMPLE, 0, :] == np.array(ck_ok)).all()


def test_limits_from_policy() -> None:
    spec = NCCLTuningPolicySpec.model_validate(
        {
            "constraints": {
                "allowedAlgorithms": ["ring"],
                "allowedProtocols": ["simple", "ll128"],
                "channels": {"min": 2, "max": 8},
                "chunkBytes": {"min": 0, "max": 1048576},
            }
        }
    )
    lim = ActionLimits.from_policy(spec)
    assert lim.algos == {Algo.RING}
    assert lim.protos == {Proto.SIMPLE, Proto.LL128}
    assert (lim.min_channels, lim.max_channels, lim.max_chunk) == (2, 8, 1 << 20)
    cons = lim.constraints()
    assert cons.algos == {Algo.RING}


def test_to_choice_and_channel_index() -> None:
    c = to_choice([Algo.NVLS.nccl_id, SIMPLE, 0, 0])
    assert (c.algo, c.proto, c.nchannels, c.chunk_bytes) == (Algo.NVLS, Proto.SIMPLE, 0, 0)
    c = to_choice([1, 1, CHANNEL_OPTIONS.index(8), CHUNK_OPTIONS.index(1 << 20)])
    assert (c.nchannels, c.chunk_bytes) == (8, 1 << 20)
    assert channel_index(None) == 0
    assert channel_index(0) == 0
    assert CHANNEL_OPTIONS[channel_index(16)] == 16
    assert CHANNEL_OPTIONS[channel_index(20)] in (16, 24)


@pytest.mark.parametrize("bad", [{"min_channels": 9, "max_channels": 4}])
def test_bad_limits(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="min_channels"):
        ActionLimits(**bad).constraints()
