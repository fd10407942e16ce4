"""The webhook over real HTTP (aiohttp test server): AdmissionReview v1 in, JSON patch out."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer

from dynamiccl import constants as c
from dynamiccl.operator.controller.cache import ObjectCache
from dynamiccl.operator.webhook import mutate
from dynamiccl.operator.webhook import server as webhook

CM = {
    "metadata": {
        "name": "llm-dynamiccl",
        "namespace": "team-a",
        "annotations": {
            c.ANNOTATION_JOB_KIND: "PyTorchJob",
            c.ANNOTATION_CONFIG_DIGEST: "sha256:abc",
        },
    },
    "data": {"env.json": '{"NCCL_NTHREADS": "256"}'},
}


def _pod(job: str | None = "llm") -> dict[str, Any]:
    labels = {c.LABEL_KUBEFLOW_JOB_NAME: job} if job else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "llm-worker-", "labels": labels},
        "spec": {"containers": [{"name": "pytorch", "image": "t"}]},
    }


def _review(pod: Any, op: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": op, "namespace": "team-a", "object": pod},
    }


async def _post(adm: webhook.Admission, body: Any) -> dict[str, Any]:
    async with TestClient(TestServer(webhook.app(adm))) as client:
        resp = await client.post("/mutate", data=json.dumps(body))
        assert resp.status == 200
        health = await client.get("/healthz")
        assert health.status == 200
        return dict(await resp.json())


def _admission(lookup: webhook.MissLookup | None = None) -> webhook.Admission:
    cms = ObjectCache()
    cms.on_event("ADDED", CM)
    return webhook.Admission(cms, image="dynamiccl:test", miss_lookup=lookup)


def test_pod_of_tuned_job_is_patched() -> None:
    out = asyncio.run(_post(_admission(), _review(_pod())))
    resp = out["response"]
    assert (out["kind"], resp["uid"], resp["allowed"]) == ("AdmissionReview", "u-1", True)
    assert resp["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(resp["patch"]))
    patched = jsonpatch.apply_patch(_pod(), patch)
    assert mutate.is_injected(patched)
    env = {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]}
    assert env["NCCL_NTHREADS"] == "256"
    assert patched["metadata"]["annotations"][c.ANNOTATION_INJECTED] == "sha256:abc"


def test_untuned_unrelated_and_malformed_requests_are_allowed_unpatched() -> None:
    for body in (
        _review(_pod("other")),
        _review(_pod(None)),
        _review(_pod(), op="UPDATE"),
        {"garbage": True},
        _review("not a pod"),
    ):
        resp = asyncio.run(_post(_admission(), body))["response"]
        assert resp["allowed"] is True
        assert "patch" not in resp


def test_cache_miss_uses_the_lookup_and_errors_never_block() -> None:
    seen: list[str] = []

    def lookup(ns: str, job: str, pod: Any) -> Any:
        seen.append(job)
        return CM if job == "late" else None

    resp = asyncio.run(_post(_admission(lookup), _review(_pod("late"))))["response"]
    assert "patch" in resp
    assert seen == ["late"]

    def broken(ns: str, job: str, pod: Any) -> Any:
        raise RuntimeError("apiserver down")

    resp = asyncio.run(_post(_admission(broken), _review(_pod("x"))))["response"]
    assert resp["allowed"] is True
    assert "patch" not in resp
    assert resp["warnings"]


def test_already_injected_pod_is_not_patched_again() -> None:
    once = mutate.mutate_pod(_pod(), mutate.Injection("llm", "PyTorchJob", "llm-dynamiccl", "i"))
    resp = asyncio.run(_post(_admission(), _review(once)))["response"]
    assert "patch" not in resp


def _post_over_http(port: int, body: Any) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/mutate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.loads(resp.read()))


def test_server_thread_answers_while_the_main_loop_is_blocked() -> None:
    server = webhook.ServerThread(webhook.app(_admission()), "127.0.0.1", 0, None)
    server.start()
    try:
        answered = threading.Event()
        out: list[dict[str, Any]] = []

        def client() -> None:
            out.append(_post_over_http(server.port, _review(_pod())))
            answered.set()

        async def main_loop_busy() -> bool:
            # kopf's loop stuck in a long (blocking) step: the webhook must not care.
            threading.Thread(target=client, daemon=True).start()
            return answered.wait(30)  # blocks this event loop until the answer arrives

        assert asyncio.run(main_loop_busy())
        assert out[0]["response"]["patchType"] == "JSONPatch"
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError, match="refused"):  # stopped: nothing listens
        _post_over_http(server.port, _review(_pod()))


def test_server_thread_reports_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = webhook.ServerThread(
            webhook.app(_admission()), "127.0.0.1", taken.getsockname()[1], None
        )
        with pytest.raises(OSError, match="address already in use"):
            server.start()


def test_a_pod_of_a_new_job_never_gets_the_config_map_of_a_deleted_one() -> None:
    """The cache still holds the ConfigMap of a deleted job of the same name (garbage
    collection pending): a pod whose owner has another uid is admitted untuned."""
    cm = json.loads(json.dumps(CM))
    cm["data"]["job.json"] = json.dumps({"name": "llm", "uid": "uid-old"})
    cms = ObjectCache()
    cms.on_event("ADDED", cm)
    adm = webhook.Admission(cms, image="dynamiccl:test")

    def owned_by(uid: str) -> dict[str, Any]:
        pod = _pod()
        ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llm", "uid": uid}
        pod["metadata"]["ownerReferences"] = [ref | {"controller": True}]
        return pod

    stale = asyncio.run(_post(adm, _review(owned_by("uid-new"))))["response"]
    assert stale["allowed"] is True
    assert "patch" not in stale
    own = asyncio.run(_post(adm, _review(owned_by("uid-old"))))["response"]
    assert "patch" in own


def test_knobs_a_policy_could_not_set_are_never_injected() -> None:
    """Issue 32 C: a tenant rewrote the job's env.json and the webhook injected
    NCCL_NET_PLUGIN=/tmp/evil.so and NCCL_BUFFSIZE=-1 into the recreated pod. The chart's
    job-config admission policy now refuses the write (tests/integration/operator/
    test_trust_boundaries_kube.py); whatever the ConfigMap says, the webhook injects only
    policy knobs within NCCL's documented range."""
    cm = json.loads(json.dumps(CM))
    cm["data"]["env.json"] = json.dumps(
        {
            "NCCL_NET_PLUGIN": "/tmp/evil.so",
            "NCCL_BUFFSIZE": "-1",
            "LD_PRELOAD": "/tmp/evil.so",
            "NCCL_NTHREADS": "256",
        }
    )
    cms = ObjectCache()
    cms.on_event("ADDED", cm)
    adm = webhook.Admission(cms, image="dynamiccl:test")
    resp = asyncio.run(_post(adm, _review(_pod())))["response"]
    patched = jsonpatch.apply_patch(_pod(), json.loads(base64.b64decode(resp["patch"])))
    env = {e["name"]: e.get("value") for e in patched["spec"]["containers"][0]["env"]}
    assert env["NCCL_NTHREADS"] == "256"
    assert "NCCL_BUFFSIZE" not in env
    assert "LD_PRELOAD" not in env
    # the plugin variables are the webhook's own, never the ConfigMap's
    assert "evil" not in json.dumps(patched)


def test_network_knobs_a_policy_set_are_injected() -> None:
    """The knob values an experiment adopted reach the training container (the operator
    writes them into env.json; tests/unit/operator/learning/test_network_knob_experiment.py
    goes from measured jobs to adoption to this injection)."""
    knobs = {
        "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_IB_SPLIT_DATA_ON_QPS": "0",
        "NCCL_NCHANNELS_PER_NET_PEER": "8",
        "NCCL_P2P_NET_CHUNKSIZE": "524288",
        "NCCL_SOCKET_NTHREADS": "4",
        "NCCL_NSOCKS_PERTHREAD": "8",
        "NCCL_CROSS_NIC": "1",
    }
    cm = json.loads(json.dumps(CM))
    cm["data"]["env.json"] = json.dumps(knobs)
    cms = ObjectCache()
    cms.on_event("ADDED", cm)
    resp = asyncio.run(_post(webhook.Admission(cms, image="dynamiccl:test"), _review(_pod())))
    patch = json.loads(base64.b64decode(resp["response"]["patch"]))
    patched = jsonpatch.apply_patch(_pod(), patch)
    env = {e["name"]: e.get("value") for e in patched["spec"]["containers"][0]["env"]}
    assert {k: env.get(k) for k in knobs} == knobs
