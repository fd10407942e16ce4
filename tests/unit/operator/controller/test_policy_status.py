"""NCCLTuningPolicy status the operator writes: observedGeneration, matchedJobs, Valid."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dynamiccl.operator.controller import handlers, policy_status

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)


class _Kube:
    def __init__(self, fail: set[str] | None = None) -> None:
        self.patches: list[tuple[str, dict[str, Any], bool]] = []
        self.fail = fail or set()

    def patch(
        self,
        res: Any,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        assert res is handlers.POLICIES
        assert namespace is None
        if name in self.fail:
            raise RuntimeError("apiserver said no")
        self.patches.append((name, dict(patch), status))
        return {}


def _policy(name: str, gen: int = 1, spec: dict[str, Any] | None = None, **status: Any) -> Any:
    return {
        "metadata": {"name": name, "generation": gen},
        "spec": spec if spec is not None else {"mode": "learned"},
        "status": status,
    }


def _run(ns: str, name: str, policy: str) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name}, "spec": {"policyName": policy}}


def _apply(pol: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    return pol | {"status": (pol.get("status") or {}) | patch["status"]}


def test_matched_jobs_valid_and_generation_are_written_once() -> None:
    pols = [_policy("a", gen=3), _policy("b")]
    runs = [
        _run("t1", "j1", "a"),
        _run("t2", "j2", "a"),
        _run("t1", "j3", "b"),
        _run("t1", "x", ""),
    ]
    kube = _Kube()
    assert policy_status.sync(kube, handlers.POLICIES, pols, runs, now=T0) == 2
    by_name = {n: p for n, p, _ in kube.patches}
    assert all(st for _, _, st in kube.patches)  # the status subresource
    a = by_name["a"]["status"]
    assert (a["observedGeneration"], a["matchedJobs"]) == (3, 2)
    (cond,) = a["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Valid", "True", "Accepted")
    assert cond["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert by_name["b"]["status"]["matchedJobs"] == 1
    # applied: a steady cluster costs no further writes
    applied = [_apply(p, by_name[p["metadata"]["name"]]) for p in pols]
    kube.patches.clear()
    assert policy_status.sync(kube, handlers.POLICIES, applied, runs, now=T1) == 0
    # a job goes away: only its policy's count changes, the condition keeps its time
    assert policy_status.sync(kube, handlers.POLICIES, applied, runs[1:], now=T1) == 1
    ((name, patch, _),) = kube.patches
    assert name == "a"
    assert patch["status"]["matchedJobs"] == 1
    assert patch["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_an_invalid_policy_says_why_and_other_keys_are_left_to_the_learning_loop() -> None:
    bad = _policy(
        "bad",
        gen=2,
        spec={"mode": "learned", "exploration": {"budgetCalls": 0}},
        learning={"retrain": {"rowsRead": 5}},
        conditions=[
            {"type": "Valid", "status": "True", "reason": "Accepted", "lastTransitionTime": "x"}
        ],
    )
    kube = _Kube()
    assert policy_status.sync(kube, handlers.POLICIES, [bad], [], now=T1) == 1
    ((_, patch, _),) = kube.patches
    st = patch["status"]
    assert set(st) == {"observedGeneration", "matchedJobs", "conditions"}  # not learning
    (cond,) = st["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "InvalidSpec")
    assert "budgetCalls" in cond["message"]
    assert cond["lastTransitionTime"] == "2026-01-02T00:00:00Z"  # it flipped
    assert cond["observedGeneration"] == 2


def test_a_failed_patch_does_not_stop_the_others() -> None:
    kube = _Kube(fail={"a"})
    pols = [_policy("a"), _policy("b")]
    assert policy_status.sync(kube, handlers.POLICIES, pols, [], now=T0) == 1
    assert [n for n, _, _ in kube.patches] == ["b"]


def test_the_written_status_is_what_the_crd_model_accepts() -> None:
    from dynamiccl.api.tuning_policy import NCCLTuningPolicyStatus  # noqa: PLC0415

    kube = _Kube()
    policy_status.sync(kube, handlers.POLICIES, [_policy("a")], [_run("t", "j", "a")], now=T0)
    ((_, patch, _),) = kube.patches
    st = NCCLTuningPolicyStatus.model_validate(patch["status"])
    assert st.matched_jobs == 1
    assert st.observed_generation == 1
    assert st.conditions[0].type == "Valid"
