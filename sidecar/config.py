"""The sidecar's configuration: the job's ConfigMap as mounted, plus the pod's environment.

The webhook (operator/webhook/mutate.py) mounts the job's ConfigMap read-only at
``$DYNAMICCL_CONFIG_DIR`` (``/etc/dynamiccl``) with the keys written by
operator/controller/configmap.py:

- ``job.json``: the job (namespace, kind, name, uid), policy, model version;
  missing or invalid is fatal (nothing could be reported);
- ``features.json``: `StateFeatures`; else no NCCL baseline estimate, and the
  number of voters / processes per pod come from flags;
- ``table.json``: the initial `DecisionTable` (or the operator's "NCCL
  everywhere" placeholder); else no table: NCCL's own choices;
- ``exploration.json``: mode, exploration budget, guardrails of the policy;
  else mode ``observe``;
- ``ingest-ca.crt``: CA bundle of the reward-ingest endpoint; else system CAs;

and sets ``DYNAMICCL_POD_NAME`` / ``_POD_NAMESPACE`` / ``_POD_UID``,
``DYNAMICCL_SHM_PATH``, ``DYNAMICCL_INGEST_URL`` / ``_TOKEN_FILE`` /
``_CA_FILE``. ``load`` returns a validated `AgentConfig` or raises
`ConfigError` with one line naming the file or variable; the sidecar then keeps
running without touching NCCL (docs/architecture.md, 'Invariants') and retries later. Problems that
only cost a feature (a bad table, bad features) are collected in ``warnings``.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dynamiccl import constants as c
from dynamiccl.api.epoch import KEPT_EPOCHS
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Proto
from dynamiccl.api.rewards import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    KIND_PATTERN,
    MODEL_VERSION_PATTERN,
    UID_PATTERN,
    JobRef,
    PodRef,
    RewardBatch,
    RewardRecord,
    TunerEvent,
)
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.tuning_policy import ChannelRange, Exploration, Guardrails, Mode
from dynamiccl.api.tuning_run import MAX_ARMS, Arm
from dynamiccl.policy.online.tuner_config import TunerConfig, sidecar_setting
from dynamiccl.sidecar.shm import ShmError, check_interval

T = TypeVar("T")

KEY_JOB: Final = "job.json"
KEY_FEATURES: Final = "features.json"
KEY_TABLE: Final = "table.json"
KEY_EXPLORATION: Final = "exploration.json"
KEY_INGEST_CA: Final = "ingest-ca.crt"
DEFAULT_CONFIG_DIR: Final = "/etc/dynamiccl"
DEFAULT_SHM_PATH: Final = "/var/run/dynamiccl/" + c.SHM_FILE_NAME
DEFAULT_TOKEN_FILE: Final = "/var/run/secrets/dynamiccl/token"
DEFAULT_EPOCH_INTERVAL: Final = 256
MAX_FILE_BYTES: Final = 1 << 20  # a ConfigMap holds at most 1 MiB


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the file or variable."""


class JobInfo(BaseModel):
    """``job.json``: the owning job and what the operator decided for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]
    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
    kind: Annotated[str, Field(pattern=KIND_PATTERN, max_length=63)]
    api_version: str = ""
    uid: Annotated[str, Field(pattern=UID_PATTERN, max_length=64)]
    policy: str = ""
    model_version: Annotated[str, Field(pattern=MODEL_VERSION_PATTERN, max_length=63)] = "default"
    canary: bool = False
    table_digest: str = ""
    # what the table was compiled for, and its cells from the class's measurements: the
    # operator keeps both for the job's life (operator/controller/configmap.py)
    compile_key: Annotated[str, Field(max_length=80)] = ""
    measured_cells: Annotated[
        tuple[Annotated[str, Field(max_length=512)], ...], Field(max_length=256)
    ] = ()
    # a canary job: the promoted version whose choices its table explores where the two
    # versions differ, and those cells (policy/runtime/arms.py; the canary judge reads them)
    arms_baseline: str = ""
    arms: Annotated[tuple[Arm, ...], Field(max_length=MAX_ARMS)] = ()


class ExplorationInfo(BaseModel):
    """``exploration.json``: the parts of the policy the sidecar acts on (others are kept)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode = Mode.OBSERVE
    policy: str = ""
    exploration: Exploration = Field(default_factory=Exploration)
    guardrails: Guardrails = Field(default_factory=Guardrails)
    constraints: dict[str, Any] = Field(default_factory=dict)
    user_constraints: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _drop_reward_weights(cls, data: Any) -> Any:
        """Operators before the removal of the policy's ``rewardWeights`` (nothing in the
        cluster acted on them) still write ``reward_weights`` into ``exploration.json``; a
        sidecar of this version reading such a ConfigMap ignores the key rather than fail."""
        if isinstance(data, dict) and "reward_weights" in data:
            return {k: v for k, v in data.items() if k != "reward_weights"}
        return data


class AgentConfig(BaseModel):
    """Everything one sidecar runs on."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    job: JobInfo
    features: StateFeatures | None = None
    table: DecisionTable | None = None
    table_reason: str = ""  # why there is no table
    exploration: ExplorationInfo = Field(default_factory=ExplorationInfo)
    pod_name: str
    pod_uid: Annotated[str, Field(pattern=UID_PATTERN, max_length=64)]
    ingest_url: str = ""
    token_file: Path = Path(DEFAULT_TOKEN_FILE)
    ca_file: Path | None = None
    shm_path: Path = Path(DEFAULT_SHM_PATH)
    state_dir: Path
    epoch_interval: int = DEFAULT_EPOCH_INTERVAL
    voters: int = Field(default=1, ge=1, le=KEPT_EPOCHS * 1000)  # pods of the job
    procs_per_pod: int = Field(default=1, ge=1, le=32)
    warnings: tuple[str, ...] = ()

    @property
    def learned(self) -> bool:
        """Online exploration allowed (mode learned and a table to tune)."""
        return self.exploration.mode is Mode.LEARNED and self.table is not None

    @property
    def channel_range(self) -> tuple[int, int] | None:
        """The channel counts the policy's constraints allow (None: unreadable)."""
        try:
            r = ChannelRange.model_validate(self.exploration.constraints.get("channels") or {})
        except ValidationError:
            return None
        return (r.min, r.max)

    @property
    def allowed_pairs(self) -> frozenset[tuple[int, int]] | None:
        """The (algorithm, protocol) ids the policy's constraints allow (None: unreadable):
        the pairs the online tuner may look at beyond the table's arms (sidecar/tuning.py)."""
        con = self.exploration.constraints
        try:
            algos = [Algo(a) for a in con.get("allowed_algorithms") or list(Algo)]
            protos = [Proto(p) for p in con.get("allowed_protocols") or list(Proto)]
        except (TypeError, ValueError):
            return None
        return frozenset((a.nccl_id, p.nccl_id) for a in algos for p in protos)

    def tuner(self) -> TunerConfig:
        """The online tuner the job's policy asks for: one race per cell over the table's arms
        and (`refine` > 0) their channel variants and the pair probes (sidecar/tuning.py),
        unless the policy's channel constraints are unreadable."""
        g, e = self.exploration.guardrails, self.exploration.exploration
        # plans reach the plugin only through epochs (tens of seconds apart): one plan per
        # round, and a probe of every pair the table leaves out (policy/online/tuner_config.py)
        return sidecar_setting(
            TunerConfig.model_validate(
                {
                    "refine": 0.5 if self.channel_range is not None else 0.0,
                    "guardrail": {
                        "threshold": g.regression_threshold,
                        "min_samples": min(g.min_samples, 1000),
                    },
                    "budget_calls": e.budget_calls,
                }
            )
        )

    def batch(
        self,
        seq: int,
        table_version: int,
        records: Sequence[RewardRecord],
        events: Sequence[TunerEvent],
    ) -> RewardBatch:
        """This pod's reward batch number `seq`."""
        j = self.job
        return RewardBatch(
            idempotency_key=f"{self.pod_uid}/{seq}",
            job=JobRef(namespace=j.namespace, kind=j.kind, name=j.name, uid=j.uid),
            pod=PodRef(name=self.pod_name, uid=self.pod_uid),
            model_version=j.model_version,
            table_version=table_version,
            records=tuple(records),
            events=tuple(events),
        )


def _read(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        return path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: missing") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc})") from exc


def _json(path: Path) -> Any:
    try:
        return json.loads(_read(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from exc


def _first_error(path: Path, exc: ValidationError) -> ConfigError:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(root)"
    return ConfigError(f"{path}: {where}: {err['msg']}")


def _parse_table(doc: Any) -> tuple[DecisionTable | None, str]:
    """A DecisionTable, or None and why (the operator's placeholder means NCCL everywhere)."""
    if isinstance(doc, dict) and "format" in doc and not doc.get("cells"):
        return None, str(doc.get("reason") or "empty")
    return DecisionTable.model_validate(doc), ""


def _token_pod(token_file: Path) -> tuple[str, str] | None:
    """(pod name, pod uid) from a projected token's claims (not verified: it is ours)."""
    try:
        part = token_file.read_text().strip().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        pod = claims["kubernetes.io"]["pod"]
        return str(pod["name"]), str(pod["uid"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _optional(path: Path, parse: Callable[[Any], T], warnings: list[str]) -> T | None:
    """An optional file's parsed value; None (and one warning) when missing or invalid."""
    try:
        return parse(_json(path))
    except ConfigError as exc:
        warnings.append(str(exc))
    except ValidationError as exc:
        warnings.append(str(_first_error(path, exc)))
    return None


def _table(path: Path, warnings: list[str]) -> tuple[DecisionTable | None, str]:
    """The table, or None and why: unreadable counts as no table, unparsable as invalid."""
    try:
        return _parse_table(_json(path))
    except ConfigError as exc:
        warnings.append(str(exc))
        return None, "no table.json"
    except ValidationError as exc:
        warnings.append(str(_first_error(path, exc)))
        return None, "invalid table.json"


def _pod_identity(
    overrides: Mapping[str, Any], env: Mapping[str, str], token_file: Path
) -> tuple[str, str]:
    """(pod name, pod uid): flags, then the environment, then the projected token's claims."""
    pod_name = overrides.get("pod_name") or env.get(c.ENV_POD_NAME, "")
    pod_uid = overrides.get("pod_uid") or env.get(c.ENV_POD_UID, "")
    if not pod_name or not pod_uid:
        from_token = _token_pod(token_file)
        if from_token is not None:
            pod_name, pod_uid = pod_name or from_token[0], pod_uid or from_token[1]
    if not pod_name:
        raise ConfigError(f"{c.ENV_POD_NAME}: not set (and no pod name in {token_file})")
    if not pod_uid:
        raise ConfigError(f"{c.ENV_POD_UID}: not set (and no pod uid in {token_file})")
    return pod_name, pod_uid


def _paths(
    config_dir: Path, overrides: Mapping[str, Any], env: Mapping[str, str]
) -> dict[str, Any]:
    """Token, CA bundle, shared-memory file and spool directory."""
    token_file = Path(
        overrides.get("token_file") or env.get(c.ENV_INGEST_TOKEN_FILE) or DEFAULT_TOKEN_FILE
    )
    ca = Path(
        overrides.get("ca_file") or env.get(c.ENV_INGEST_CA_FILE) or config_dir / KEY_INGEST_CA
    )
    shm_path = Path(overrides.get("shm_path") or env.get(c.ENV_SHM_PATH) or DEFAULT_SHM_PATH)
    if shm_path.is_dir():  # a directory (the emptyDir's mount point): our file inside it
        shm_path = shm_path / c.SHM_FILE_NAME
    return {
        "token_file": token_file,
        "ca_file": ca if ca.is_file() else None,  # None: the system's CA bundle
        "shm_path": shm_path,
        "state_dir": Path(overrides.get("state_dir") or shm_path.parent / "sidecar-state"),
    }


def _int(
    overrides: Mapping[str, Any], env: Mapping[str, str], name: str, env_name: str, default: int
) -> int:
    """An integer setting: the flag, else the environment, else the default."""
    raw = overrides.get(name)
    if raw is None:
        raw = env.get(env_name) or default
    try:
        return int(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{env_name}: not an integer: {raw!r}") from exc


def load(
    config_dir: Path,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> AgentConfig:
    """Read and validate; `overrides` (CLI flags) win over the environment."""
    env = os.environ if env is None else env
    warnings: list[str] = []
    job_path = config_dir / KEY_JOB
    try:
        job = JobInfo.model_validate(_json(job_path))
    except ValidationError as exc:
        raise _first_error(job_path, exc) from exc
    features = _optional(config_dir / KEY_FEATURES, StateFeatures.model_validate, warnings)
    table, reason = _table(config_dir / KEY_TABLE, warnings)
    exploration = _optional(config_dir / KEY_EXPLORATION, ExplorationInfo.model_validate, warnings)
    paths = _paths(config_dir, overrides, env)
    pod_name, pod_uid = _pod_identity(overrides, env, paths["token_file"])
    data = {
        "job": job,
        "features": features,
        "table": table,
        "table_reason": "" if table is not None else reason,
        "exploration": exploration or ExplorationInfo(),
        "pod_name": pod_name,
        "pod_uid": pod_uid,
        "ingest_url": overrides.get("ingest_url") or env.get(c.ENV_INGEST_URL, ""),
        **paths,
        "epoch_interval": _int(
            overrides, env, "epoch_interval", c.ENV_EPOCH_INTERVAL, DEFAULT_EPOCH_INTERVAL
        ),
        "voters": _int(
            overrides, env, "voters", c.ENV_VOTERS, features.replicas if features else 1
        ),
        "procs_per_pod": _int(
            overrides,
            env,
            "procs_per_pod",
            c.ENV_PROCS_PER_POD,
            features.nproc_per_node if features else 1,
        ),
        "warnings": tuple(warnings),
    }
    try:
        cfg = AgentConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from exc
    try:
        check_interval(cfg.epoch_interval)
    except ShmError as exc:
        raise ConfigError(f"{c.ENV_EPOCH_INTERVAL}: {exc}") from exc
    return cfg
