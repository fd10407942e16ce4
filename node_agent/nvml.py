"""NVML through nvidia-ml-py, behind our own small wrapper.

:class:`NvmlBackend` is the wrapper interface: the few NVML queries discovery
needs, each raising :class:`NvmlError` with NVML's error name. Two backends:

* :class:`PynvmlBackend` calls the real library (``pynvml``);
* :class:`RecordedBackend` answers from ``<root>/.dynamiccl-recorded/nvml.json``
  (what NVML answered on a real machine, including errors), so that every
  code path above the wrapper runs unchanged in tests.

``collect`` turns the answers into a :class:`GpuReport`; an NVML error is a
condition naming what it left unknown, never an exception.
"""

from __future__ import annotations

import contextlib
import json
import uuid as uuidlib
from typing import Any, Final, Protocol

from dynamiccl.api.node_topology import GpuFabric, NvLinkRemote, Source
from dynamiccl.node_agent import gpu_table
from dynamiccl.node_agent import sysfs_values as sv
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.gpu_report import GpuReport, ReportedGpu, aggregate
from dynamiccl.node_agent.hostroot import HostRoot

RECORDING: Final = "nvml.json"
NOT_SUPPORTED: Final = "NVML_ERROR_NOT_SUPPORTED"
INVALID_ARGUMENT: Final = "NVML_ERROR_INVALID_ARGUMENT"
REMOTE_TYPES: Final = {0: NvLinkRemote.GPU, 2: NvLinkRemote.NVSWITCH}
FABRIC_STATES: Final = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}


class NvmlError(Exception):
    """An NVML call failed; ``code`` is NVML's name, e.g. NVML_ERROR_NOT_SUPPORTED."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class NvmlBackend(Protocol):
    """The NVML queries discovery uses (device = NVML index)."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def pci_bus_id(self, dev: int) -> str: ...
    def name(self, dev: int) -> str: ...
    def uuid(self, dev: int) -> str: ...
    def compute_capability(self, dev: int) -> tuple[int, int]: ...
    def mig_mode(self, dev: int) -> int: ...
    def nvlink_state(self, dev: int, link: int) -> bool: ...
    def nvlink_remote_type(self, dev: int, link: int) -> int: ...
    def nvlink_remote_pci_bus_id(self, dev: int, link: int) -> str: ...
    def fabric_info(self, dev: int) -> tuple[str, int, int, int]: ...


# --------------------------------------------------------------------------- recorded
class RecordedBackend:
    """Answers NVML queries from a recording (JSON, see tests/fixtures/hosts/README.md)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @staticmethod
    def _value(node: Any) -> Any:
        if isinstance(node, dict) and "error" in node:
            raise NvmlError(str(node["error"]))
        return node

    def _get(self, key: str) -> Any:
        if key not in self._data:
            raise NvmlError(NOT_SUPPORTED)
        return self._value(self._data[key])

    def _dev(self, dev: int) -> dict[str, Any]:
        devices = self._data.get("devices", [])
        if not isinstance(devices, list) or not 0 <= dev < len(devices):
            raise NvmlError(INVALID_ARGUMENT)
        d = devices[dev]
        if not isinstance(d, dict):
            raise NvmlError("NVML_ERROR_UNKNOWN")
        return d

    def _field(self, dev: int, key: str) -> Any:
        d = self._dev(dev)
        if key not in d:
            raise NvmlError(NOT_SUPPORTED)
        return self._value(d[key])

    def _link(self, dev: int, link: int, key: str) -> Any:
        d = self._dev(dev)
        if "nvlink_error" in d:
            raise NvmlError(str(d["nvlink_error"]))
        links = d.get("nvlink", [])
        if not isinstance(links, list) or not 0 <= link < len(links):
            raise NvmlError(INVALID_ARGUMENT)
        entry = self._value(links[link])
        if not isinstance(entry, dict) or key not in entry:
            raise NvmlError(NOT_SUPPORTED)
        return self._value(entry[key])

    def init(self) -> None:
        if self._data.get("init") is not None:
            raise NvmlError(str(self._data["init"]))

    def shutdown(self) -> None:
        return None

    def driver_version(self) -> str:
        return str(self._get("driver_version"))

    def device_count(self) -> int:
        if "device_count" in self._data:
            return int(self._get("device_count"))
        return len(self._data.get("devices", []))

    def pci_bus_id(self, dev: int) -> str:
        return str(self._field(dev, "pci_bus_id"))

    def name(self, dev: int) -> str:
        return str(self._field(dev, "name"))

    def uuid(self, dev: int) -> str:
        return str(self._field(dev, "uuid"))

    def compute_capability(self, dev: int) -> tuple[int, int]:
        major, minor = self._field(dev, "cuda_compute_capability")
        return int(major), int(minor)

    def mig_mode(self, dev: int) -> int:
        return int(self._field(dev, "mig_mode")[0])

    def nvlink_state(self, dev: int, link: int) -> bool:
        return bool(self._link(dev, link, "state"))

    def nvlink_remote_type(self, dev: int, link: int) -> int:
        return int(self._link(dev, link, "remote_device_type"))

    def nvlink_remote_pci_bus_id(self, dev: int, link: int) -> str:
        return str(self._link(dev, link, "remote_pci_bus_id"))

    def fabric_info(self, dev: int) -> tuple[str, int, int, int]:
        f = self._field(dev, "gpu_fabric_info")
        return str(f["cluster_uuid"]), int(f["clique_id"]), int(f["state"]), int(f["status"])


# --------------------------------------------------------------------------- live
class PynvmlBackend:  # pragma: no cover - needs an NVIDIA driver
    """The real NVML, through nvidia-ml-py."""

    def __init__(self) -> None:
        import pynvml  # noqa: PLC0415 - optional at import time

        self._n: Any = pynvml
        self._handles: dict[int, Any] = {}
        self._names = {getattr(pynvml, k): k for k in dir(pynvml) if k.startswith("NVML_ERROR_")}

    def _call(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._n, fn)(*args)
        except self._n.NVMLError as exc:
            raise NvmlError(self._names.get(exc.value, f"NVML_ERROR_{exc.value}")) from exc
        except AttributeError as exc:
            raise NvmlError("NVML_ERROR_FUNCTION_NOT_FOUND") from exc

    def _h(self, dev: int) -> Any:
        if dev not in self._handles:
            self._handles[dev] = self._call("nvmlDeviceGetHandleByIndex", dev)
        return self._handles[dev]

    @staticmethod
    def _s(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        with contextlib.suppress(NvmlError):
            self._call("nvmlShutdown")

    def driver_version(self) -> str:
        return self._s(self._call("nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def pci_bus_id(self, dev: int) -> str:
        return self._s(self._call("nvmlDeviceGetPciInfo", self._h(dev)).busId)

    def name(self, dev: int) -> str:
        return self._s(self._call("nvmlDeviceGetName", self._h(dev)))

    def uuid(self, dev: int) -> str:
        return self._s(self._call("nvmlDeviceGetUUID", self._h(dev)))

    def compute_capability(self, dev: int) -> tuple[int, int]:
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", self._h(dev))
        return int(major), int(minor)

    def mig_mode(self, dev: int) -> int:
        return int(self._call("nvmlDeviceGetMigMode", self._h(dev))[0])

    def nvlink_state(self, dev: int, link: int) -> bool:
        return bool(self._call("nvmlDeviceGetNvLinkState", self._h(dev), link))

    def nvlink_remote_type(self, dev: int, link: int) -> int:
        return int(self._call("nvmlDeviceGetNvLinkRemoteDeviceType", self._h(dev), link))

    def nvlink_remote_pci_bus_id(self, dev: int, link: int) -> str:
        info = self._call("nvmlDeviceGetNvLinkRemotePciInfo", self._h(dev), link)
        return self._s(info.busId)

    def fabric_info(self, dev: int) -> tuple[str, int, int, int]:
        info = self._n.c_nvmlGpuFabricInfo_t()
        self._call("nvmlDeviceGetGpuFabricInfo", self._h(dev), self._n.byref(info))
        cluster = str(uuidlib.UUID(bytes=bytes(info.clusterUuid)))
        return cluster, int(info.cliqueId), int(info.state), int(info.status)


def backend_for(host: HostRoot, conds: Conditions) -> NvmlBackend | None:
    """The recorded backend for a recording root, else the live library (or None)."""
    if host.recorded is not None:
        text = host.recorded_text(RECORDING)
        if text is None:
            conds.add("nvml", "Unavailable", "no NVML recording: NVML absent on this host")
            return None
        try:
            data = json.loads(text)
        except ValueError:
            conds.add("nvml", "Garbled", f"{RECORDING}: not valid JSON")
            return None
        if not isinstance(data, dict):
            conds.add("nvml", "Garbled", f"{RECORDING}: expected an object")
            return None
        return RecordedBackend(data)
    try:
        return PynvmlBackend()
    except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
        conds.add("nvml", "Unavailable", "nvidia-ml-py (pynvml) not installed")
        return None


# --------------------------------------------------------------------------- collect
def _links(
    be: NvmlBackend, dev: int, bus: str, sm: int | None, conds: Conditions
) -> tuple[bool, list[tuple[NvLinkRemote, str | None]]]:
    found: list[tuple[NvLinkRemote, str | None]] = []
    for link in range(gpu_table.max_nvlinks(sm) if sm is not None else 18):
        try:
            if not be.nvlink_state(dev, link):
                continue
        except NvmlError as exc:
            if exc.code in (NOT_SUPPORTED, INVALID_ARGUMENT):
                break  # no such link: the GPU has fewer (or no) NVLinks
            conds.add(f"gpus[{bus}].nvlink", "NvmlError", f"nvlink {link} state: {exc.code}")
            return False, []
        remote_bus: str | None
        try:
            remote_bus = sv.bus_id(be.nvlink_remote_pci_bus_id(dev, link))
        except (NvmlError, ValueError):
            remote_bus = None
        try:
            kind = REMOTE_TYPES.get(be.nvlink_remote_type(dev, link), NvLinkRemote.UNKNOWN)
        except NvmlError:
            kind = NvLinkRemote.UNKNOWN
        found.append((kind, remote_bus))
    return True, found


def _device(be: NvmlBackend, dev: int, conds: Conditions) -> ReportedGpu | None:
    try:
        bus = sv.bus_id(be.pci_bus_id(dev))
    except (NvmlError, ValueError) as exc:
        why = exc.code if isinstance(exc, NvmlError) else "garbled bus id"
        conds.add(f"nvml.devices[{dev}]", "NvmlError", f"PCI bus id: {why}")
        return None
    g = ReportedGpu(bus_id=bus, index=dev)
    field = f"gpus[{bus}]"
    try:
        g.name = be.name(dev)
    except NvmlError as exc:
        conds.add(f"{field}.product", "NvmlError", f"name: {exc.code}")
    try:
        g.uuid = be.uuid(dev)
    except NvmlError:
        g.uuid = None
    try:
        major, minor = be.compute_capability(dev)
        g.sm = major * 10 + minor
    except NvmlError as exc:
        conds.add(f"{field}.computeCapability", "NvmlError", f"compute capability: {exc.code}")
    try:
        g.mig_enabled = be.mig_mode(dev) == 1
    except NvmlError as exc:
        g.mig_enabled = False if exc.code == NOT_SUPPORTED else None
    g.nvlink_known, raw = _links(be, dev, bus, g.sm, conds)
    g.nvlinks = aggregate(raw)
    try:
        cluster, clique, state, status = be.fabric_info(dev)
        g.fabric = GpuFabric(
            cluster_uuid=cluster,
            clique_id=clique,
            state=FABRIC_STATES.get(state, str(state)),
        )
        if status != 0:
            conds.add(f"{field}.fabric", "NvmlError", f"fabric status {status}")
    except NvmlError as exc:
        if exc.code != NOT_SUPPORTED:
            conds.add(f"{field}.fabric", "NvmlError", f"fabric info: {exc.code}")
    return g


def _resolve_remotes(report: GpuReport) -> None:
    """Links NVML could not type but whose far end is a GPU we know: type them."""
    buses = set(report.by_bus())
    for g in report.gpus:
        raw: list[tuple[NvLinkRemote, str | None]] = []
        for link in g.nvlinks:
            kind = link.remote
            if kind is NvLinkRemote.UNKNOWN and link.remote_bus_id in buses:
                kind = NvLinkRemote.GPU
            raw.extend([(kind, link.remote_bus_id)] * link.links)
        g.nvlinks = aggregate(raw)


def collect(be: NvmlBackend, conds: Conditions) -> GpuReport | None:
    """Query NVML; ``None`` (with a condition) when NVML cannot be initialised."""
    try:
        be.init()
    except NvmlError as exc:
        conds.add("nvml", "Unavailable", f"nvmlInit: {exc.code}")
        return None
    try:
        report = GpuReport(source=Source.NVML)
        try:
            report.driver_version = be.driver_version()
        except NvmlError as exc:
            conds.add("driverVersion", "NvmlError", f"driver version: {exc.code}")
        try:
            count = be.device_count()
        except NvmlError as exc:
            conds.add("nvml", "NvmlError", f"device count: {exc.code}")
            return None
        for dev in range(count):
            g = _device(be, dev, conds)
            if g is not None:
                report.gpus.append(g)
        _resolve_remotes(report)
        return report
    finally:
        be.shutdown()
