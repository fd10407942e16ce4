"""Pod mutation: sidecar, init step, volumes, env; user NCCL env wins; idempotent."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl import constants as c
from dynamiccl.operator.webhook import mutate

INJ = mutate.Injection(
    job_name="llm",
    job_kind="PyTorchJob",
    config_map="llm-dynamiccl",
    image="dynamiccl:test",
    env_knobs={"NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": "8388608"},
    config_digest="sha256:x",
)


def _pod(env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "annotations": {"keep": "me"}},
        "spec": {
            "initContainers": [{"name": "wait", "image": "busybox"}],
            "containers": [
                {"name": "trainer", "image": "t", "env": env or []},
                {"name": "logger", "image": "l"},
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def _env(ct: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in ct.get("env", [])}


def test_adds_sidecar_init_volumes_and_env() -> None:
    out = mutate.mutate_pod(_pod(), INJ)
    spec = out["spec"]
    names = [i["name"] for i in spec["initContainers"]]
    assert names == [mutate.INIT_INSTALL, mutate.SIDECAR, "wait"]
    side = spec["initContainers"][1]
    assert side["restartPolicy"] == "Always"
    assert side["command"] == ["dynamiccl", "sidecar"]
    sc = side["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert side["resources"]["requests"] == {"cpu": "50m", "memory": "64Mi"}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols[mutate.VOL_CONFIG]["configMap"] == {"name": "llm-dynamiccl", "optional": True}
    assert vols[mutate.VOL_SHM]["emptyDir"]["medium"] == "Memory"
    assert "dshm" in vols
    for ct in spec["containers"]:
        env = _env(ct)
        lib = f"{mutate.PLUGIN_DIR}/{c.PLUGIN_LIBRARY}"
        assert env[c.ENV_NCCL_TUNER_PLUGIN] == lib
        assert env[c.ENV_NCCL_PROFILER_PLUGIN] == lib
        assert env["NCCL_NTHREADS"] == "256"
        assert {m["name"] for m in ct["volumeMounts"]} == {mutate.VOL_PLUGIN, mutate.VOL_SHM}
    ann = out["metadata"]["annotations"]
    assert ann[c.ANNOTATION_INJECTED] == "sha256:x"
    assert ann["keep"] == "me"
    assert c.ANNOTATION_USER_NCCL_ENV not in ann


def test_user_nccl_env_is_never_overridden_and_recorded() -> None:
    user: list[dict[str, Any]] = [
        {"name": "NCCL_NTHREADS", "value": "512"},
        {"name": "NCCL_ALGO", "value": "Tree"},
        {"name": "NCCL_PROTO", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}},
    ]
    out = mutate.mutate_pod(_pod(user), INJ)
    trainer = out["spec"]["containers"][0]
    env = _env(trainer)
    assert env["NCCL_NTHREADS"] == "512"
    assert [e["name"] for e in trainer["env"]].count("NCCL_NTHREADS") == 1
    assert env["NCCL_ALGO"] == "Tree"
    recorded = json.loads(out["metadata"]["annotations"][c.ANNOTATION_USER_NCCL_ENV])
    assert recorded == {"NCCL_ALGO": "Tree", "NCCL_NTHREADS": "512", "NCCL_PROTO": "<valueFrom>"}


def test_input_is_not_modified_and_mutation_is_idempotent() -> None:
    pod = _pod()
    before = json.dumps(pod, sort_keys=True)
    once = mutate.mutate_pod(pod, INJ)
    assert json.dumps(pod, sort_keys=True) == before
    assert mutate.mutate_pod(once, INJ) == once
    assert mutate.is_injected(once)
    assert not mutate.is_injected(pod)


def _every_container(doc: Any) -> list[dict[str, Any]]:
    spec = doc["spec"]
    return [*spec["initContainers"], *spec["containers"]]


def test_the_mutated_pod_shares_nothing_with_the_request_s_pod() -> None:
    """mutate_pod copies what it keeps (the answer's patch shares the mutated pod's
    values, patch.diff): changing its result leaves the request's pod as it was."""
    pod = _pod([{"name": "NCCL_ALGO", "value": "Tree"}])
    before = json.dumps(pod, sort_keys=True)
    out = mutate.mutate_pod(pod, INJ)
    out["metadata"]["annotations"]["keep"] = "changed"
    for ct in _every_container(out):
        ct["image"] = "changed"
        for e in ct.get("env", []):
            e["value"] = "changed"
    for v in out["spec"]["volumes"]:
        v.clear()
    assert json.dumps(pod, sort_keys=True) == before


def test_existing_mount_path_is_not_shadowed() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "mine", "mountPath": mutate.SHM_DIR}]
    out = mutate.mutate_pod(pod, INJ)
    mounts = out["spec"]["containers"][0]["volumeMounts"]
    assert [m["mountPath"] for m in mounts].count(mutate.SHM_DIR) == 1


_ENV = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(
                ["NCCL_ALGO", "NCCL_NTHREADS", "NCCL_TUNER_PLUGIN", "PATH", "X"]
            ),
            "value": st.text(max_size=5),
        }
    ),
    max_size=5,
)


@given(_ENV)
def test_property_user_values_survive_and_idempotent(env: list[dict[str, Any]]) -> None:
    pod = _pod(env)
    out = mutate.mutate_pod(pod, INJ)
    trainer = out["spec"]["containers"][0]
    first_value: dict[str, str] = {}
    for e in env:
        first_value.setdefault(e["name"], e["value"])
    got: dict[str, str] = {}
    for e in trainer["env"]:
        got.setdefault(e["name"], e["value"])
    for name, value in first_value.items():
        assert got[name] == value
    assert mutate.mutate_pod(out, INJ) == out


def _with_service_account_token(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the ServiceAccount admission plugin leaves it (it runs before webhooks)."""
    mount = {"name": "kube-api-access-x7k2p", "readOnly": True, "mountPath": mutate.SA_TOKEN_PATH}
    for ct in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        ct.setdefault("volumeMounts", []).append(dict(mount))
    pod["spec"]["volumes"].append({"name": "kube-api-access-x7k2p", "projected": {"sources": []}})
    return pod


def _service_account_plugin(pod: dict[str, Any]) -> bool:
    """Re-run the plugin's container rule; True if it changed the pod (=> webhook re-invoked)."""
    vol = next(v["name"] for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-"))
    changed = False
    for ct in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        mounts = ct.setdefault("volumeMounts", [])
        if all(m["mountPath"] != mutate.SA_TOKEN_PATH for m in mounts):
            mounts.append({"name": vol, "readOnly": True, "mountPath": mutate.SA_TOKEN_PATH})
            changed = True
    return changed


def test_no_second_webhook_call_when_the_token_is_automounted() -> None:
    out = mutate.mutate_pod(_with_service_account_token(_pod()), INJ)
    for ct in out["spec"]["initContainers"][:2]:  # ours: the same mount the plugin would add
        assert {"name": "kube-api-access-x7k2p", "readOnly": True,
                "mountPath": mutate.SA_TOKEN_PATH} in ct["volumeMounts"]  # fmt: skip
    assert not _service_account_plugin(out)
    # Without an automounted token nothing is added (the plugin adds nothing either).
    plain = mutate.mutate_pod(_pod(), INJ)
    for ct in plain["spec"]["initContainers"]:
        assert all(m["mountPath"] != mutate.SA_TOKEN_PATH for m in ct.get("volumeMounts", []))
