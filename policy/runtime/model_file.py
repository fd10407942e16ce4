"""Model files without torch: where they live, their errors, the layout check, `.npz` writing.

A model is trained and saved with torch (`default.pt`); for decisions it is
also exported to a plain numpy archive (`default.npz`, `python -m
dynamiccl.policy.train.export`) that `numpy_policy.NumpyPolicy` runs without torch.
Both loaders apply the same compatibility check (`check_layout`).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dynamiccl.policy.runtime.encode import OBS_DIM, OBS_VERSION
from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS, HEADS

MODELS_DIR: Final = Path(__file__).resolve().parents[1] / "models"
DEFAULT_MODEL: Final = MODELS_DIR / "default.pt"
DEFAULT_NPZ: Final = MODELS_DIR / "default.npz"
NPZ_FORMAT: Final = "dynamiccl.policy.npz/v1"
# Fixed zip member metadata: identical arrays give identical bytes.
_ZIP_TIME: Final = (1980, 1, 1, 0, 0, 0)


class ModelError(ValueError):
    """A model file is missing, unreadable or for another observation layout."""


def check_layout(
    p: Path,
    obs_version: object,
    obs_dim: object,
    channel_options: Sequence[int],
    chunk_options: Sequence[int],
) -> None:
    """ModelError unless a model's observation layout and action options are this code's."""
    if obs_version != OBS_VERSION or obs_dim != OBS_DIM:
        raise ModelError(
            f"{p}: observation layout v{obs_version} ({obs_dim} features) does not match "
            f"this code's v{OBS_VERSION} ({OBS_DIM} features); retrain with `dynamiccl train`"
        )
    if tuple(channel_options) != CHANNEL_OPTIONS:
        raise ModelError(
            f"{p}: action options differ from this code's: channel options "
            f"{list(channel_options)} != {list(CHANNEL_OPTIONS)}; retrain"
        )
    if tuple(chunk_options) != CHUNK_OPTIONS:
        raise ModelError(
            f"{p}: action options differ from this code's: chunk options "
            f"{list(chunk_options)} != {list(CHUNK_OPTIONS)}; retrain"
        )


def state_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight's shape for a network config (`PolicyNet.config()`): its state_dict."""
    a, p, c, k = (int(x) for x in config["heads"])
    h, e = int(config["hidden"]), int(config["emb"])
    in_dim = int(config["obs_dim"]) + a + p + c + k + 1
    return {
        "pick_gain": (2,),
        "encoder.0.weight": (h, in_dim),
        "encoder.0.bias": (h,),
        "encoder.2.weight": (h, h),
        "encoder.2.bias": (h,),
        "lstm.weight_ih_l0": (4 * h, h),
        "lstm.weight_hh_l0": (4 * h, h),
        "lstm.bias_ih_l0": (4 * h,),
        "lstm.bias_hh_l0": (4 * h,),
        "post.0.weight": (h, 2 * h),
        "post.0.bias": (h,),
        "emb_algo.weight": (a, e),
        "emb_proto.weight": (p, e),
        "emb_ch.weight": (c, e),
        "head_algo.weight": (a, h),
        "head_algo.bias": (a,),
        "head_proto.weight": (p, h + e),
        "head_proto.bias": (p,),
        "head_ch.weight": (c, h + 2 * e),
        "head_ch.bias": (c,),
        "head_chunk.weight": (k, h + 3 * e),
        "head_chunk.bias": (k,),
        "value.weight": (1, h),
        "value.bias": (1,),
    }


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_npz(path: Path, arrays: Mapping[str, NDArray[Any]]) -> None:
    """An uncompressed `.npz` (readable by `np.load`) with byte-stable content.

    `np.savez` stamps every member with the current time; here members are in
    name order with a fixed timestamp, so identical arrays give identical
    bytes. The file is replaced atomically.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.create_system = 3
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())
    tmp.replace(path)


def check_weights(
    p: object, pre: str, config: Mapping[str, Any], state: Mapping[str, NDArray[Any]]
) -> None:
    """ModelError unless `state` is exactly the float32 weights of network `config`."""
    try:
        shapes = state_shapes(config)
        heads = tuple(config["heads"])
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelError(f"{p}: {pre}config is not a network config: {exc}") from None
    if heads != HEADS.as_tuple():
        raise ModelError(f"{p}: {pre}heads {list(heads)} differ from this code's; retrain")
    extra = sorted(set(state) - set(shapes))
    if extra:
        raise ModelError(f"{p}: unexpected weights {extra[:3]} for this network config")
    for name, shape in shapes.items():
        got = state.get(name)
        if got is None:
            raise ModelError(f"{p}: weights incomplete: {pre}{name!r} is missing")
        if got.shape != shape or got.dtype != np.float32:
            raise ModelError(
                f"{p}: weight {pre}{name!r} is {got.dtype}{list(got.shape)}, "
                f"expected float32{list(shape)}"
            )
