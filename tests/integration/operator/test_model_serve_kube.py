"""A canary job's table compiled from a registered model fetched from the ingest process.

REAL kube-apiserver (TokenReview of TokenRequest tokens of real ServiceAccounts),
the ingest as its own process (`python -m dynamiccl.operator.ingest.main
--model-reader ...`) with a SQLite store holding a registered version, and the
reconciler's pure decision (`reconcile.decide`) with the operator's
`RegistryCompiler` and its real HTTPS adapter.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes import client as k8s

from dynamiccl import constants as c
from dynamiccl.operator.controller import configmap, model_fetch, reconcile
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ, write_npz
from dynamiccl.testing import builders, certs, scripts

ROOT = Path(__file__).resolve().parents[3]
AUDIENCE = "dynamiccl-ingest"


def _mint(core: k8s.CoreV1Api, ns: str, sa: str) -> str:
    req = core.create_namespaced_service_account_token(
        sa,
        ns,
        {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 600}},  # type: ignore[arg-type]  # the client takes dict bodies
    )
    assert req.status is not None
    return str(req.status.token)


def _register(tmp: Path, version: str) -> str:
    """`models/<version>/model.pt` + its export (the shipped weights), registered; the store URL."""
    out = tmp / "models" / version
    out.mkdir(parents=True)
    pt = out / "model.pt"
    pt.write_bytes(f"weights of {version}".encode())
    digest = hashlib.sha256(pt.read_bytes()).hexdigest()
    with np.load(DEFAULT_NPZ, allow_pickle=False) as z:
        arrays = {n: z[n] for n in z.files}
    arrays["source_sha256"] = np.array(digest)
    write_npz(out / "model.npz", arrays)
    store_url = str(tmp / "exp.db")
    store = open_store(store_url)
    try:
        ModelRegistry(store.backend).register(version, sha256=digest, uri=str(pt))
    finally:
        store.close()
    return store_url


@pytest.fixture(scope="module")
def env(
    cluster_kubeconfig: Path, admin_api: k8s.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("model-serve")
    core = k8s.CoreV1Api(admin_api)
    ns = f"models-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    for sa in ("operator", "other"):
        core.create_namespaced_service_account(ns, {"metadata": {"name": sa}})  # type: ignore[arg-type]  # the client takes dict bodies
    store_url = _register(tmp, "v2")
    crt, key = certs.write_self_signed(tmp / "tls")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamiccl.operator.ingest.main",
            *("--store", store_url, "--host", "127.0.0.1", "--port", "0"),
            *("--tls-cert", str(crt), "--tls-key", str(key)),
            *("--kubeconfig", str(cluster_kubeconfig)),
            *("--model-reader", f"system:serviceaccount:{ns}:operator"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"ingest process did not start: {err[-2000:]}")
        port = json.loads(line)["port"]
        tokens = {sa: _mint(core, ns, sa) for sa in ("operator", "other")}
        yield {"ns": ns, "port": port, "ca": crt.read_text(), "tokens": tokens, "tmp": tmp}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        core.delete_namespace(ns, propagation_policy="Background")


def _compiler(env: dict[str, Any], sa: str) -> model_fetch.RegistryCompiler:
    token = env["tmp"] / f"token-{sa}"
    token.write_text(env["tokens"][sa])
    return model_fetch.RegistryCompiler(
        f"https://127.0.0.1:{env['port']}/v1/rewards", token_file=token, ca=lambda: env["ca"]
    )


def _decide(canary: str, compiler: configmap.Compiler) -> tuple[reconcile.Outcome, dict[str, Any]]:
    policy = {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": "canary", "uid": "p"},
        "spec": {
            "mode": "static",
            "model": {"version": "default", "canaryVersion": canary, "canaryPercent": 100},
        },
    }
    job = builders.pytorchjob(
        "llm",
        namespace="team",
        uid="u-1",
        annotations={c.ANNOTATION_TUNE: "true"},
        master=False,
        workers=2,
        pod=builders.template(builders.container(gpus=0, image="x")),
        nproc_per_node=None,
    )
    pols, errors = parse_policies([policy])
    assert not errors
    # the local cluster's fake H100 nodes: the job's GPU and fabric
    nodes = scripts.load("gen_nodes").expand()
    out = reconcile.decide(reconcile.Inputs(job, {}, pols, cluster_nodes=nodes, compiler=compiler))
    assert out is not None
    assert out.config_map is not None
    return out, json.loads(out.config_map["data"][configmap.KEY_TABLE])


def test_a_canary_job_gets_the_registered_models_table(env: dict[str, Any]) -> None:
    comp = _compiler(env, "operator")
    out, table = _decide("v2", comp)
    assert out.decision.canary
    assert out.decision.model_version == "v2"
    assert not configmap.model_unavailable(table)
    assert "reason" not in table  # compiled, not the empty placeholder
    # the registered weights are the shipped ones here: the same table as the stable version
    shipped = configmap.initial_table(
        out.decision.features,  # type: ignore[arg-type]
        _policy_spec(),
        configmap.SHIPPED_MODEL_VERSION,
    )
    assert table == shipped
    assert comp.fetches == 1
    _decide("v2", comp)  # the loaded model (and the table) are reused
    assert comp.fetches == 1


def _policy_spec() -> Any:
    from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec  # noqa: PLC0415

    return NCCLTuningPolicySpec.model_validate(
        {
            "mode": "static",
            "model": {"version": "default", "canaryVersion": "v2", "canaryPercent": 100},
        }
    )


def test_an_unregistered_canary_runs_nccl_defaults_with_the_reason(env: dict[str, Any]) -> None:
    _, table = _decide("v9", _compiler(env, "operator"))
    assert table["cells"] == []
    assert table["reason"].startswith("no-model:v9: ingest answered HTTP 404")
    assert configmap.model_unavailable(table)


def test_another_service_account_cannot_read_models(env: dict[str, Any]) -> None:
    _, table = _decide("v2", _compiler(env, "other"))
    assert table["cells"] == []
    assert "HTTP 403" in table["reason"]
    assert f"system:serviceaccount:{env['ns']}:other" in table["reason"]
