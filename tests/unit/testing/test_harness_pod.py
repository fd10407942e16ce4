"""The real-node harness's per-table accounting, and the real tier's judgement built on it.

`by_epoch` splits a rank's calls by the table in effect (the plugin's rule: the largest
committed epoch whose boundary is at or below the call index); `tuned_effect` (the real
tier's check) reads what the tuners' tables did from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dynamiccl
from dynamiccl.testing.harness_pod import by_epoch
from dynamiccl.testing.real_manifests import Harness, harness_data, pytorchjob
from tests.real.training import took_effect, tuned_effect

BIG, SMALL = "4:33554432", "4:6144"


def _calls(n: int, own: float, ran: float) -> list[tuple[str, float, float, float]]:
    return [(BIG, ran * 1.01, own, ran)] * n


def test_calls_are_split_at_the_boundaries_that_took_effect() -> None:
    played = [*_calls(64, 180, 180), *_calls(128, 180, 190), *_calls(64, 180, 100)]
    epochs = [
        {"epoch": 1, "boundary": 64, "table": "a"},
        {"epoch": 2, "boundary": 192, "table": "b"},
        {"epoch": 3, "boundary": 256, "table": "c"},  # committed after the last call: never ran
    ]
    parts = by_epoch(epochs, played)
    assert [(x["epoch"], x["from"], x["calls"]) for x in parts] == [
        (0, 0, 64),
        (1, 64, 128),
        (2, 192, 64),
    ]
    assert parts[2]["keys"][BIG] == {
        "calls": 64,
        "played_us": pytest.approx(64 * 101.0),
        "nccl_us": 64 * 180.0,
        "ran_us": 64 * 100.0,
    }
    assert took_effect(epochs, 256) == epochs[:2]


def test_the_tuners_tables_are_judged_apart_from_the_initial_table() -> None:
    """Epoch 1 is the job's initial table (it explores: slower); epoch 2 a tuner's (faster)."""
    played = [*_calls(100, 180, 180), *_calls(300, 180, 200), *_calls(600, 180, 100)]
    epochs = [{"epoch": 1, "boundary": 100}, {"epoch": 2, "boundary": 400}]
    effect = tuned_effect(by_epoch(epochs, played))
    assert effect["tuned_share"] == pytest.approx(0.6)
    assert effect["tuned_speedup"] == pytest.approx(1.8)
    own, ran = 1000 * 180, 100 * 180 + 300 * 200 + 600 * 100
    assert effect["job_speedup"] == pytest.approx(own / ran)


def test_a_tuner_table_slower_than_nccl_shows_as_a_slowdown() -> None:
    played = [*_calls(100, 180, 180), *_calls(100, 180, 180), *_calls(800, 180, 200)]
    epochs = [{"epoch": 1, "boundary": 100}, {"epoch": 2, "boundary": 200}]
    effect = tuned_effect(by_epoch(epochs, played))
    assert effect["tuned_speedup"] == pytest.approx(0.9)
    assert effect["job_speedup"] < 1


def test_without_a_tuner_table_nothing_counts_as_tuned() -> None:
    played = [*_calls(100, 180, 180), (SMALL, 10.0, 10.0, 10.0), *_calls(99, 180, 170)]
    effect = tuned_effect(by_epoch([{"epoch": 1, "boundary": 100}], played))
    assert effect["tuned_share"] == 0
    assert effect["tuned_speedup"] == 0


# A fresh interpreter as in the runtime image: dynamiccl without its testing and demo packages
# (the wheel excludes both), so only what the pod's mount carries can provide the NCCL player
# and the other test stand-ins the script imports.
_IMAGE_LIKE = """
import runpy, sys
from importlib.machinery import PathFinder
repo_pkg = sys.argv[1]
finders = list(sys.meta_path)
class ImageLike:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in ("dynamiccl.testing", "dynamiccl.demo"):  # only where the mount put them
            return PathFinder.find_spec(name, [p for p in path or [] if p != repo_pkg], target)
        specs = (f.find_spec(name, path, target) for f in finders if hasattr(f, "find_spec"))
        return next((s for s in specs if s is not None), None)
sys.meta_path = [ImageLike]
runpy.run_path(sys.argv[2] + "/harness_pod.py", run_name="harness")
print(sys.modules["dynamiccl.testing.nccl_player"].__file__)
print(sys.modules["dynamiccl.testing.rank"].__file__)
"""


def _mount(tmp: Path, items: list[dict[str, str]] | None) -> Path:
    """The harness ConfigMap's projection into the pod (`items`: key -> path; None: every key
    as a file of its name, the mount before the player travelled with it)."""
    data = harness_data(Harness(steps=1, seed=1))
    for it in items if items is not None else [{"key": k, "path": k} for k in data]:
        (tmp / it["path"]).parent.mkdir(parents=True, exist_ok=True)
        (tmp / it["path"]).write_text(data[it["key"]])
    return tmp


def _run_in_image(mount: Path) -> subprocess.CompletedProcess[str]:
    repo_pkg = str(Path(dynamiccl.__file__).resolve().parent)
    return subprocess.run(
        [sys.executable, "-c", _IMAGE_LIKE, repo_pkg, str(mount)],
        env={**os.environ, "HARNESS_DIR": str(mount)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_pod_plays_with_the_player_its_configmap_carries(tmp_path: Path) -> None:
    job = pytorchjob("train-01", "img:1", {}, {})
    (source, _times) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"][
        0
    ]["projected"]["sources"]
    mount = _mount(tmp_path / "mount", source["configMap"]["items"])
    ran = _run_in_image(mount)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [
        str(mount / "dynamiccl" / "testing" / "nccl_player.py"),
        str(mount / "dynamiccl" / "testing" / "rank.py"),
    ]
    # without the items (every key a flat file) the image-like interpreter has neither
    flat = _run_in_image(_mount(tmp_path / "flat", None))
    assert flat.returncode != 0
    assert "No module named 'dynamiccl.testing'" in flat.stderr
