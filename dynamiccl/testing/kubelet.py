"""The demo's stand-in for the kubelet: a mutated pod's volumes and env on the local disk.

Given a pod as the admission webhook mutated it, this does what a kubelet
would before starting its containers, with directories instead of mounts:

- every volume of the pod gets a local directory: an `emptyDir` starts empty,
  a `configMap` volume holds the ConfigMap's keys as files, a projected
  ServiceAccount token volume holds the pod's token;
- a container's environment is resolved (`value`, and `valueFrom.fieldRef`
  for the pod fields the downward API offers) and every path under one of the
  container's `mountPath`s is rewritten to the volume's local directory;
- an init container's command runs with the same rewriting (the plugin
  install step copies the `.so` "from the image": the image's
  `/opt/dynamiccl/lib` is this checkout's `plugin/build`).

Nothing here knows what DynamICCL injects: it reads the pod spec, so the demo
runs exactly what the webhook produced.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamiccl.operator.webhook.mutate import IMAGE_PLUGIN_PATH

TokenFor = Callable[[Mapping[str, Any]], str]  # pod -> its projected token


class KubeletError(ValueError):
    """The pod cannot be started as specified (the message names what is missing)."""


@dataclass(frozen=True)
class Volumes:
    """A pod's volumes as local directories."""

    dirs: dict[str, Path]

    def mounts(self, container: Mapping[str, Any]) -> list[tuple[str, Path]]:
        """(mountPath, local dir) of a container, longest mount path first."""
        out = []
        for m in container.get("volumeMounts") or []:
            name = str(m.get("name"))
            if name not in self.dirs:
                raise KubeletError(f"container {container.get('name')}: no volume {name!r}")
            out.append((str(m["mountPath"]).rstrip("/"), self.dirs[name]))
        return sorted(out, key=lambda t: -len(t[0]))

    def rewrite(self, container: Mapping[str, Any], value: str) -> str:
        """`value` with a mounted container path replaced by its local directory."""
        for mount, local in self.mounts(container):
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount) :]
        return value


def materialize(
    pod: Mapping[str, Any],
    root: Path,
    config_maps: Mapping[str, Mapping[str, Any]],
    token_for: TokenFor,
) -> Volumes:
    """Create the pod's volumes under `root` (a missing optional ConfigMap stays empty)."""
    dirs: dict[str, Path] = {}
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        name = str(vol["name"])
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        dirs[name] = d
        if "configMap" in vol:
            ref = vol["configMap"]
            cm = config_maps.get(str(ref.get("name")))
            if cm is None:
                if not ref.get("optional"):
                    raise KubeletError(f"volume {name}: ConfigMap {ref.get('name')} not found")
                continue
            for key, text in (cm.get("data") or {}).items():
                (d / key).write_text(str(text))
        elif "projected" in vol:
            for src in vol["projected"].get("sources") or []:
                sat = src.get("serviceAccountToken")
                if sat is not None:
                    path = d / str(sat.get("path", "token"))
                    path.write_text(token_for(pod))
                    path.chmod(0o600)
    return Volumes(dirs)


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API field of the pod."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    fields = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": "127.0.0.1",
    }
    if path not in fields:
        raise KubeletError(f"fieldRef {path!r} is not supported by the demo")
    return str(fields[path] or "")


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], volumes: Volumes
) -> dict[str, str]:
    """The container's environment, with mounted paths rewritten to local directories."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = str(item["name"])
        if "value" in item:
            env[name] = volumes.rewrite(container, str(item["value"]))
        elif "fieldRef" in (item.get("valueFrom") or {}):
            env[name] = field_value(pod, str(item["valueFrom"]["fieldRef"]["fieldPath"]))
        else:
            raise KubeletError(f"container {container.get('name')}: env {name}: unsupported source")
    return env


def container(pod: Mapping[str, Any], name: str, *, init: bool = False) -> Mapping[str, Any]:
    """One container (or init container) of the pod by name."""
    key = "initContainers" if init else "containers"
    for ct in (pod.get("spec") or {}).get(key) or []:
        if ct.get("name") == name:
            return dict(ct)
    raise KubeletError(f"pod {(pod.get('metadata') or {}).get('name')}: no {key[:-1]} {name!r}")


def run_init(
    pod: Mapping[str, Any], ct: Mapping[str, Any], volumes: Volumes, image_lib: Path
) -> None:
    """Run an init container's command locally (the image's plugin path → `image_lib`)."""
    image_dir = str(Path(IMAGE_PLUGIN_PATH).parent)
    argv = []
    for arg in ct.get("command") or []:
        text = str(arg)
        if text == image_dir or text.startswith(image_dir + "/"):
            text = str(image_lib) + text[len(image_dir) :]
        argv.append(volumes.rewrite(ct, text))
    if not argv:
        raise KubeletError(f"init container {ct.get('name')}: no command")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KubeletError(f"init container {ct.get('name')}: {argv} failed: {done.stderr.strip()}")
