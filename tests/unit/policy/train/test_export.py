"""`.npz` model files: deterministic export, shipped export in sync, loader choice, bad files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynamiccl.policy.runtime.encode import OBS_VERSION
from dynamiccl.policy.runtime.model_file import (
    DEFAULT_MODEL,
    DEFAULT_NPZ,
    ModelError,
    file_sha256,
    write_npz,
)
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from dynamiccl.policy.runtime.ranker import load_ranker
from dynamiccl.policy.train import export
from dynamiccl.policy.train.inference import Policy, new_policy


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small saved model and its export."""
    d = tmp_path_factory.mktemp("small")
    pol = new_policy(5, hidden=16)
    pol.meta = {"seed": 5}
    pol.save(d / "m.pt")
    assert export.main(["--model", str(d / "m.pt")]) == 0
    return d / "m.pt", d / "m.npz"


def test_export_is_byte_deterministic(small: tuple[Path, Path], tmp_path: Path) -> None:
    pt, npz = small
    assert export.main(["--model", str(pt), "--out", str(tmp_path / "again.npz")]) == 0
    assert _sha(tmp_path / "again.npz") == _sha(npz)
    arrays = _arrays(npz)
    assert str(arrays["source_sha256"]) == file_sha256(pt)
    assert all(v.dtype == np.float32 for k, v in arrays.items() if k.startswith("state/"))


def test_the_shipped_export_matches_the_shipped_model(tmp_path: Path) -> None:
    fresh = tmp_path / "default.npz"
    assert export.main(["--model", str(DEFAULT_MODEL), "--out", str(fresh)]) == 0
    committed, again = _arrays(DEFAULT_NPZ), _arrays(fresh)
    assert sorted(committed) == sorted(again)
    for key in ("config", "meta"):
        assert json.loads(str(committed[key])) == json.loads(str(again[key])), key
    for key, value in again.items():
        assert committed[key].dtype == value.dtype, key
        np.testing.assert_array_equal(committed[key], value, err_msg=key)
    # Stale exports (default.pt retrained, default.npz not) fail here: re-run
    # `python -m dynamiccl.policy.train.export`.
    assert str(committed["source_sha256"]) == file_sha256(DEFAULT_MODEL)


def test_export_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export.main(["--model", str(tmp_path / "none.pt")]) == 2
    assert "none.pt: model file not found" in capsys.readouterr().err
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"junk")
    assert export.main(["--model", str(junk)]) == 2
    assert "not a DynamICCL model" in capsys.readouterr().err
    assert export.main(["--model", str(junk), "--out", str(junk)]) == 2
    assert "would overwrite the model" in capsys.readouterr().err
    assert not (tmp_path / "junk.npz").exists()


def test_load_ranker_prefers_a_matching_export(small: tuple[Path, Path], tmp_path: Path) -> None:
    pt, npz = small
    assert isinstance(load_ranker(pt), NumpyPolicy)
    assert isinstance(load_ranker(npz), NumpyPolicy)
    assert isinstance(load_ranker(), NumpyPolicy)  # the shipped pair
    # Retrained .pt, old .npz next to it: the .npz is stale, torch loads the .pt.
    other = tmp_path / "m.pt"
    new_policy(6, hidden=16).save(other)
    (tmp_path / "m.npz").write_bytes(npz.read_bytes())
    assert isinstance(load_ranker(other), Policy)
    # A broken .npz next to a .pt: torch; without the .pt: the .npz's error.
    (tmp_path / "m.npz").write_bytes(b"PK\x03\x04 broken")
    assert isinstance(load_ranker(other), Policy)
    other.unlink()
    with pytest.raises(ModelError, match="not a DynamICCL model archive"):
        load_ranker(other)
    # No .pt, an export only: the export.
    (tmp_path / "m.npz").write_bytes(npz.read_bytes())
    assert isinstance(load_ranker(other), NumpyPolicy)
    # No export: torch.
    only_pt = tmp_path / "only.pt"
    new_policy(7, hidden=16).save(only_pt)
    assert isinstance(load_ranker(only_pt), Policy)


def _rewrite(src: Path, dst: Path, **changes: Any) -> Path:
    arrays = _arrays(src)
    for name, value in changes.items():
        key = name.replace("__", "/")
        if value is None:
            del arrays[key]
        else:
            arrays[key] = np.asarray(value)
    write_npz(dst, arrays)
    return dst


def test_bad_files_name_the_problem(small: tuple[Path, Path], tmp_path: Path) -> None:
    pt, npz = small
    with pytest.raises(ModelError, match=r"missing\.npz: model file not found"):
        NumpyPolicy.load(tmp_path / "missing.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match=r"junk\.npz: not a DynamICCL model archive"):
        NumpyPolicy.load(junk)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    with pytest.raises(ModelError, match=r"cut\.npz: not a DynamICCL model archive"):
        NumpyPolicy.load(cut)
    with pytest.raises(ModelError, match="no format marker"):
        NumpyPolicy.load(pt)  # a torch file is a zip too
    bad: list[tuple[dict[str, Any], str]] = [
        ({"obs_version": OBS_VERSION - 1}, f"observation layout v{OBS_VERSION - 1} "),
        ({"channel_options": [0, 1, 2]}, "channel options .* differ|differ from this code's"),
        ({"chunk_options": [0, 65536]}, "chunk options"),
        ({"obs_version": None}, "observation layout vNone"),
        ({"format": "something/v9"}, "format 'something/v9'"),
        ({"config": "{not json"}, "not a DynamICCL model archive"),
        ({"state__head_ch.bias": None}, "'head_ch.bias' is missing"),
        ({"state__head_ch.bias": np.zeros(3, np.float32)}, r"'head_ch.bias' is float32\[3\]"),
        ({"state__post.0.bias": np.zeros(16)}, r"float64\[16\], expected float32\[16\]"),
        ({"state__extra.weight": np.zeros(2, np.float32)}, "unexpected weights"),
    ]
    for i, (changes, message) in enumerate(bad):
        path = _rewrite(npz, tmp_path / f"bad{i}.npz", **changes)
        with pytest.raises(ModelError, match=message):
            NumpyPolicy.load(path)
    config = json.loads(str(_arrays(npz)["config"]))
    wrong_dim = _rewrite(npz, tmp_path / "dim.npz", config=json.dumps({**config, "obs_dim": 9}))
    with pytest.raises(ModelError, match=r"\(9 features\) does not match"):
        NumpyPolicy.load(wrong_dim)
