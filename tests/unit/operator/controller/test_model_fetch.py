"""RegistryCompiler: any registered version's table, fetched from the ingest at our HTTP adapter.

The fetch function (`model_fetch.Fetch`) is replaced by a table of URLs; the
archives are the shipped `default.npz` (a real export) and garbage bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller import configmap as cm
from dynamiccl.operator.controller import model_fetch as mf
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy

NPZ = DEFAULT_NPZ.read_bytes()
SOURCE = NumpyPolicy.load(DEFAULT_NPZ).source_sha256 or ""
INGEST = "https://dynamiccl-ingest.dynamiccl-system.svc:8443/v1/rewards"
URL = "https://dynamiccl-ingest.dynamiccl-system.svc:8443/v1/models/{}.npz"


@pytest.fixture
def features(h100_job_features: dict[str, Any]) -> StateFeatures:
    return StateFeatures.model_validate(h100_job_features)


POLICY = NCCLTuningPolicySpec.model_validate({"mode": "static"})


class FakeIngest:
    """URL -> (archive, source digest header) or an error message; records every call."""

    def __init__(self) -> None:
        self.served: dict[str, mf.Fetched | str] = {}
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, url: str, token: str, ca: str, timeout: float) -> mf.Fetched:
        self.calls.append((url, token, ca))
        got = self.served.get(url, "ingest answered HTTP 404: not registered")
        if isinstance(got, str):
            raise mf.FetchError(got)
        return got


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _compiler(
    tmp_path: Path, ingest: FakeIngest, clock: Clock | None = None, **kw: Any
) -> tuple[mf.RegistryCompiler, list[tuple[Any, str]]]:
    token = tmp_path / "token"
    token.write_text("operator-token\n")
    compiled: list[tuple[Any, str]] = []

    def compile_table(model: Any, f: StateFeatures, p: NCCLTuningPolicySpec) -> dict[str, Any]:
        compiled.append((model, f.topology.name))
        return {"format": cm.TABLE_FORMAT, "cells": [{"fake": True}], "model": id(model)}

    def shipped(f: StateFeatures, p: NCCLTuningPolicySpec, v: str) -> dict[str, Any]:
        return {"format": cm.TABLE_FORMAT, "cells": [{"shipped": v}]}

    comp = mf.RegistryCompiler(
        INGEST,
        token_file=token,
        ca=lambda: "CA-PEM",
        fetch=ingest,
        shipped=shipped,
        compile_table=compile_table,
        clock=clock or Clock(),
        **kw,
    )
    return comp, compiled


def test_model_url_keeps_only_scheme_and_host() -> None:
    assert mf.model_url(INGEST, "v-2") == URL.format("v-2")
    assert mf.model_url("http://127.0.0.1:9/", "a.b") == "http://127.0.0.1:9/v1/models/a.b.npz"


def test_a_registered_version_is_fetched_verified_and_compiled(
    features: StateFeatures, tmp_path: Path
) -> None:
    ingest = FakeIngest()
    ingest.served[URL.format("v2")] = mf.Fetched(NPZ, SOURCE)
    comp, compiled = _compiler(tmp_path, ingest)
    table = cm.initial_table(features, POLICY, "v2", comp)
    assert table["cells"] == [{"fake": True}]
    assert ingest.calls == [(URL.format("v2"), "operator-token", "CA-PEM")]
    assert isinstance(compiled[0][0], NumpyPolicy)


def test_the_real_compile_runs_on_a_fetched_model(features: StateFeatures, tmp_path: Path) -> None:
    ingest = FakeIngest()
    ingest.served[URL.format("v2")] = mf.Fetched(NPZ, SOURCE)
    comp, _ = _compiler(tmp_path, ingest)
    comp._compile_table = None  # the policy package's compile_table
    table = cm.initial_table(features, POLICY, "v2", comp)
    assert "reason" not in table  # compiled (not the empty placeholder)
    shipped = cm.initial_table(features, POLICY, cm.SHIPPED_MODEL_VERSION, cm.shipped_compiler())
    assert table == shipped  # the same weights give the same table


def test_the_shipped_version_is_never_fetched(features: StateFeatures, tmp_path: Path) -> None:
    ingest = FakeIngest()
    comp, _ = _compiler(tmp_path, ingest)
    table = cm.initial_table(features, POLICY, cm.SHIPPED_MODEL_VERSION, comp)
    assert table["cells"] == [{"shipped": "default"}]
    assert ingest.calls == []
    with pytest.raises(cm.ModelUnavailable):
        comp.model(cm.SHIPPED_MODEL_VERSION)


def test_unknown_version_gives_nccl_choice_with_the_reason_and_is_retried_later(
    features: StateFeatures,
    tmp_path: Path,
) -> None:
    ingest = FakeIngest()
    clock = Clock()
    comp, _ = _compiler(tmp_path, ingest, clock, retry_after_s=30)
    table = cm.initial_table(features, POLICY, "v9", comp)
    assert table["cells"] == []
    assert table["reason"] == "no-model:v9: ingest answered HTTP 404: not registered"
    assert cm.model_unavailable(table)
    # within the back-off: the same answer, no new request
    assert cm.initial_table(features, POLICY, "v9", comp)["reason"] == table["reason"]
    assert len(ingest.calls) == 1
    # registered meanwhile: after the back-off it is fetched and compiled
    ingest.served[URL.format("v9")] = mf.Fetched(NPZ, SOURCE)
    clock.t += 31
    assert cm.initial_table(features, POLICY, "v9", comp)["cells"] == [{"fake": True}]
    assert len(ingest.calls) == 2


@pytest.mark.parametrize(
    ("served", "why"),
    [
        (mf.Fetched(b"garbage, not a zip", SOURCE), "not a usable model archive"),
        (mf.Fetched(NPZ[: len(NPZ) // 2], SOURCE), "not a usable model archive"),
        (mf.Fetched(NPZ, "f" * 64), "registry digest ffffffffffff"),
        ("ingest unreachable: [Errno 111] Connection refused", "ingest unreachable"),
    ],
)
def test_bad_answers_never_become_a_table(
    features: StateFeatures, tmp_path: Path, served: Any, why: str
) -> None:
    ingest = FakeIngest()
    ingest.served[URL.format("v3")] = served
    comp, compiled = _compiler(tmp_path, ingest)
    table = cm.initial_table(features, POLICY, "v3", comp)
    assert table["cells"] == []
    assert table["reason"].startswith("no-model:v3: ")
    assert why in table["reason"]
    assert compiled == []


def test_loaded_models_are_kept_in_a_small_lru(tmp_path: Path) -> None:
    ingest = FakeIngest()
    for v in ("a", "b", "c"):
        ingest.served[URL.format(v)] = mf.Fetched(NPZ, SOURCE)
    comp, _ = _compiler(tmp_path, ingest, max_models=2)
    first = comp.model("a")
    assert comp.model("a") is first  # reused, not fetched again
    comp.model("b")
    comp.model("a")  # a is now the most recent
    comp.model("c")  # evicts b
    assert comp.fetches == 3
    comp.model("a")
    assert comp.fetches == 3
    comp.model("b")
    assert comp.fetches == 4


def test_missing_token_and_missing_url_are_reasons_not_exceptions(
    features: StateFeatures, tmp_path: Path
) -> None:
    ingest = FakeIngest()
    comp, _ = _compiler(tmp_path, ingest)
    comp.token_file = tmp_path / "absent"
    reason = cm.initial_table(features, POLICY, "v4", comp)["reason"]
    assert reason.startswith("no-model:v4: token ")
    comp2, _ = _compiler(tmp_path, ingest)
    comp2.ingest_url = ""
    assert "no --ingest-url" in cm.initial_table(features, POLICY, "v4", comp2)["reason"]
    assert "not a valid version" in cm.initial_table(features, POLICY, "../x", comp2)["reason"]
    assert ingest.calls == []


def test_https_fetch_reports_an_unreachable_ingest() -> None:
    with pytest.raises(mf.FetchError, match="ingest unreachable"):
        mf.https_fetch("https://127.0.0.1:9/v1/models/x.npz", "t", "", 2.0)
