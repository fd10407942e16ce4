"""The node agent's loop: re-discover, publish only what changed, never flap.

A discovered change is published once it has been seen in ``stable_rounds``
consecutive discoveries (the first publish of a node is immediate), so a port
that bounces between two rounds changes no label. Reads every round catch
edits made by others; writes happen only when the cluster differs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dynamiccl.api.node_topology import NodeTopology
from dynamiccl.node_agent import nccl_xml, publish, topo_file
from dynamiccl.node_agent.discover import Discovery, discover
from dynamiccl.node_agent.hostroot import HostRoot
from dynamiccl.node_agent.kube import KubeError, TopologyApi

log = logging.getLogger("dynamiccl.node_agent")


@dataclass
class RoundResult:
    """What one round did."""

    writes: int
    pending: bool
    error: str | None = None
    plan: publish.Plan | None = None


@dataclass
class AgentLoop:
    """State kept between rounds for one node."""

    api: TopologyApi
    host: HostRoot
    node_name: str
    stable_rounds: int = 2
    nccl_xml_path: Path | None = None
    topo_file_mode: topo_file.Mode = topo_file.Mode.OFF  # publish NCCL_TOPO_FILE's XML
    discover_fn: Callable[..., Discovery] = discover
    _candidate: NodeTopology | None = None
    _seen: int = 0
    _published: bool = False
    history: list[RoundResult] = field(default_factory=list)

    def _stable(self, topo: NodeTopology) -> bool:
        if self._candidate is not None and self._candidate == topo:
            self._seen += 1
        else:
            self._candidate, self._seen = topo, 1
        return self._seen >= self.stable_rounds

    def _write_xml(self, disc: Discovery) -> None:
        if self.nccl_xml_path is None:
            return
        text = nccl_xml.render(disc)
        path = self.nccl_xml_path
        try:
            if path.exists() and path.read_text() == text:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
        except OSError as exc:
            log.warning("cannot write NCCL topology XML %s: %s", path, exc)

    def round(self) -> RoundResult:
        """Discover once and publish if needed."""
        try:
            labels = self.api.get_node_labels(self.node_name)
            current = self.api.get_topology(self.node_name)
        except KubeError as exc:
            return self._done(RoundResult(writes=0, pending=False, error=str(exc)))
        override = publish.sharp_override(labels or {})
        disc = self.discover_fn(self.host, name=self.node_name, sharp_override=override)
        topo = topo_file.with_file(disc, self.topo_file_mode)
        self._write_xml(disc)
        first = current is None and not self._published
        if not first and not self._stable(topo):
            return self._done(RoundResult(writes=0, pending=True))
        p = publish.plan(topo, current, labels)
        try:
            if p.create is not None:
                self.api.create_topology(p.create)
            if p.status is not None:
                self.api.replace_topology_status(self.node_name, p.status)
            if p.labels is not None:
                self.api.patch_node_labels(self.node_name, p.labels)
        except KubeError as exc:
            return self._done(RoundResult(writes=0, pending=True, error=str(exc), plan=p))
        self._published = True
        self._candidate, self._seen = topo, self.stable_rounds
        return self._done(RoundResult(writes=p.writes, pending=False, plan=p))

    def _done(self, r: RoundResult) -> RoundResult:
        self.history.append(r)
        if r.error:
            log.warning("node %s: %s", self.node_name, r.error)
        elif r.writes:
            log.info("node %s: published (%d writes)", self.node_name, r.writes)
        return r
