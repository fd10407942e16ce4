"""The kubelet stand-in: volumes as directories, env rewritten, init commands run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dynamiccl import constants as c
from dynamiccl.operator.webhook import mutate
from dynamiccl.testing.kubelet import (
    KubeletError,
    Volumes,
    container,
    container_env,
    field_value,
    materialize,
    run_init,
)


def _pod() -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "nodeName": "node-0",
            "containers": [
                {"name": "pytorch", "image": "x", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}
            ],
        },
    }
    inj = mutate.Injection(
        job_name="j",
        job_kind="PyTorchJob",
        config_map="j-dynamiccl",
        image="img",
        ingest_url="https://ingest/v1/rewards",
    )
    return mutate.mutate_pod(pod, inj)


def test_volumes_hold_the_configmap_and_the_token(tmp_path: Path) -> None:
    pod = _pod()
    cm = {"data": {"job.json": json.dumps({"name": "j"}), "table.json": "{}"}}
    vols = materialize(
        pod, tmp_path, {"j-dynamiccl": cm}, lambda p: "TOKEN-" + p["metadata"]["uid"]
    )
    assert (vols.dirs[mutate.VOL_CONFIG] / "job.json").read_text() == json.dumps({"name": "j"})
    assert (vols.dirs[mutate.VOL_TOKEN] / "token").read_text() == "TOKEN-u-1"
    assert list(vols.dirs[mutate.VOL_SHM].iterdir()) == []


def test_a_missing_optional_configmap_leaves_the_volume_empty(tmp_path: Path) -> None:
    vols = materialize(_pod(), tmp_path, {}, lambda p: "t")
    assert list(vols.dirs[mutate.VOL_CONFIG].iterdir()) == []
    pod = _pod()
    for v in pod["spec"]["volumes"]:
        if "configMap" in v:
            v["configMap"]["optional"] = False
    with pytest.raises(KubeletError, match="not found"):
        materialize(pod, tmp_path / "b", {}, lambda p: "t")


def test_container_env_is_rewritten_to_local_directories(tmp_path: Path) -> None:
    pod = _pod()
    vols = materialize(pod, tmp_path, {}, lambda p: "t")
    env = container_env(pod, container(pod, "pytorch"), vols)
    assert env["NCCL_DEBUG"] == "INFO"  # the user's own env is untouched
    assert env[c.ENV_SHM_PATH] == str(vols.dirs[mutate.VOL_SHM] / c.SHM_FILE_NAME)
    assert env[c.ENV_NCCL_TUNER_PLUGIN] == str(vols.dirs[mutate.VOL_PLUGIN] / c.PLUGIN_LIBRARY)
    side = container_env(pod, container(pod, mutate.SIDECAR, init=True), vols)
    assert side[c.ENV_POD_NAME] == "p"
    assert side[c.ENV_POD_UID] == "u-1"
    assert side[c.ENV_CONFIG_DIR] == str(vols.dirs[mutate.VOL_CONFIG])
    assert side[c.ENV_INGEST_TOKEN_FILE] == str(vols.dirs[mutate.VOL_TOKEN] / "token")
    assert side[c.ENV_INGEST_URL] == "https://ingest/v1/rewards"


def test_paths_outside_mounts_and_prefix_lookalikes_stay(tmp_path: Path) -> None:
    vols = Volumes({"v": tmp_path / "v"})
    ct = {"name": "x", "volumeMounts": [{"name": "v", "mountPath": "/data"}]}
    assert vols.rewrite(ct, "/data/a") == str(tmp_path / "v" / "a")
    assert vols.rewrite(ct, "/database") == "/database"
    assert vols.rewrite(ct, "relative") == "relative"
    with pytest.raises(KubeletError, match="no volume"):
        Volumes({}).rewrite(ct, "/data")


def test_fields_and_unsupported_sources() -> None:
    pod = _pod()
    assert field_value(pod, "spec.nodeName") == "node-0"
    with pytest.raises(KubeletError, match="not supported"):
        field_value(pod, "status.hostIP")
    ct = {"name": "x", "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}
    with pytest.raises(KubeletError, match="unsupported source"):
        container_env(pod, ct, Volumes({}))
    with pytest.raises(KubeletError, match="no container"):
        container(pod, "nope")


def test_the_install_step_copies_the_plugin_from_the_image(tmp_path: Path) -> None:
    pod = _pod()
    vols = materialize(pod, tmp_path / "vols", {}, lambda p: "t")
    image_lib = tmp_path / "image-lib"
    image_lib.mkdir()
    (image_lib / c.PLUGIN_LIBRARY).write_bytes(b"\x7fELF fake")
    run_init(pod, container(pod, mutate.INIT_INSTALL, init=True), vols, image_lib)
    assert (vols.dirs[mutate.VOL_PLUGIN] / c.PLUGIN_LIBRARY).read_bytes() == b"\x7fELF fake"
    (image_lib / c.PLUGIN_LIBRARY).unlink()
    with pytest.raises(KubeletError, match="failed"):
        run_init(pod, container(pod, mutate.INIT_INSTALL, init=True), vols, image_lib)
