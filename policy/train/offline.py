"""Offline updates from real experience: reward records of the jobs the sidecars measured.

A record (`dynamiccl.api.rewards.RewardRecord`) says: in this job, calls of
this (collective, size bucket, communicator) ran configuration X `count` times
with mean time T, where NCCL's own choice is estimated at T0. The update is
advantage-weighted regression (Peng et al. 2019): maximise the log-probability
of each recorded configuration, weighted by exp(beta * log(T0 / T)) (clipped),
so configurations that measured faster than NCCL's default are imitated and
slower ones are nearly ignored. Real measurements thus move the policy towards
what worked on real hardware, without a simulator in the loop.

Records carry no topology; the job's state features are stored with the
experience (`job_features`, schema version 5, written by the learning loop from
the job's TuningRun) and read with the rows (policy/train/store_data.py, which
counts every row it cannot use by reason); a features file mapping job uid ->
StateFeatures may add or override them. `read_store` + `offline_update` are the
in-memory form of the same update (small stores, tests).

The store is read directly (SQLite path / `sqlite:///path`, or
`postgresql://...`) with one SELECT over the `experience` table of
`operator/store/migrations.py`; only the policy's adapter knows that schema.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.rewards import RewardRecord
from dynamiccl.api.store_secrets import redact_message, redact_store_url
from dynamiccl.policy.runtime.space import ActionLimits
from dynamiccl.policy.train.inference import Policy
from dynamiccl.policy.train.store_data import Encoded, TrainingData, Weighting, encode

_COLUMNS = (
    "id, job_uid, collective, size_bucket, nbytes_min, nbytes_max, nranks, nnodes, algo, proto, "
    "nchannels, "
    "chunk_bytes, origin, count, mean_time_us, p50_time_us, p99_time_us, busbw_gbps, "
    "nccl_default_time_us"
)
_FIELDS = (
    "collective",
    "size_bucket",
    "nbytes_min",
    "nbytes_max",
    "nranks",
    "nnodes",
    "algo",
    "proto",
    "nchannels",
    "chunk_bytes",
    "origin",
    "count",
    "mean_time_us",
    "p50_time_us",
    "p99_time_us",
    "busbw_GBps",
    "nccl_default_time_us",
)


class ExperienceError(ValueError):
    """The experience store or the features file cannot be read; the message says which."""


@dataclass(frozen=True)
class Experience:
    """One stored record with its job uid and store id."""

    id: int
    job_uid: str
    record: RewardRecord


class OfflineConfig(BaseModel):
    """Advantage-weighted regression settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=200, ge=0)
    batch: int = Field(default=256, ge=1)
    lr: float = Field(default=3e-4, gt=0)
    beta: float = Field(default=10.0, ge=0, description="inverse temperature on log-speedup")
    max_weight: float = Field(default=20.0, gt=0)


def read_store(url: str, after_id: int = 0) -> list[Experience]:
    """Every experience row with id > after_id, in id order."""
    sql = f"SELECT {_COLUMNS} FROM experience WHERE id > ? ORDER BY id"
    if url.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg  # noqa: PLC0415 - optional backend

            with psycopg.connect(url) as conn:
                rows = conn.execute(sql.replace("?", "%s"), (after_id,)).fetchall()
        except Exception as exc:  # psycopg raises many types
            raise ExperienceError(redact_message(f"store {url}: {exc}", url)) from None
    else:
        path = Path(url.removeprefix("sqlite:///").removeprefix("sqlite://"))
        if not path.exists():
            raise ExperienceError(f"store {redact_store_url(url)}: no such SQLite file")
        try:
            lite = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows = lite.execute(sql, (after_id,)).fetchall()
            finally:
                lite.close()
        except sqlite3.Error as exc:
            raise ExperienceError(redact_message(f"store {url}: {exc}", url)) from None
    out = []
    for row in rows:
        try:
            rec = RewardRecord.model_validate(dict(zip(_FIELDS, row[2:], strict=True)))
        except ValidationError as exc:
            raise ExperienceError(
                f"store {redact_store_url(url)}: experience row {row[0]}: {exc}"
            ) from None
        out.append(Experience(id=int(row[0]), job_uid=str(row[1]), record=rec))
    return out


def read_features(path: Path) -> dict[str, StateFeatures]:
    """A YAML/JSON mapping job uid -> state features."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ExperienceError(f"features {path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ExperienceError(f"features {path}: not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ExperienceError(f"features {path}: expected a mapping job uid -> features")
    out = {}
    for uid, doc in data.items():
        try:
            out[str(uid)] = StateFeatures.model_validate(doc)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ExperienceError(f"features {path}: {uid}: {where}: {first['msg']}") from None
    return out


def training_data(
    experience: Sequence[Experience],
    features: Mapping[str, StateFeatures],
    cfg: OfflineConfig,
) -> TrainingData:
    """In-memory records (with a features mapping) folded like the store's rows."""
    data = TrainingData(weighting=Weighting(cfg.beta, cfg.max_weight))
    keys: dict[str, str] = {}
    for e in experience:
        data.records += 1
        data.cursor = max(data.cursor, e.id)
        f = features.get(e.job_uid)
        if f is None:
            data.skipped["no_features"] += 1
            continue
        key = keys.get(e.job_uid)
        if key is None:
            key = keys[e.job_uid] = f"job:{e.job_uid}"
            data.features[key] = f
        data.add(key, e.record)
    return data


def prepare(
    policy: Policy,
    experience: Sequence[Experience],
    features: Mapping[str, StateFeatures],
    cfg: OfflineConfig,
    limits: ActionLimits | None = None,
) -> tuple[Encoded | None, dict[str, float]]:
    """Encode usable records; counts of used and skipped ones."""
    data = training_data(experience, features, cfg)
    enc = encode(data, policy, limits)
    return enc, data.stats()


def fit(
    policy: Policy, enc: Encoded | None, cfg: OfflineConfig, *, rng: np.random.Generator
) -> dict[str, float]:
    """Advantage-weighted regression steps on encoded (point, configuration) weights."""
    if enc is None or cfg.steps == 0:
        return {}
    obs = torch.from_numpy(enc.obs)
    feasible = torch.from_numpy(enc.feasible)
    actions = torch.from_numpy(enc.actions)
    weight = torch.from_numpy(enc.weight)
    net = policy.net
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    n = obs.shape[0]
    losses = []
    for _ in range(cfg.steps):
        idx = torch.from_numpy(rng.integers(0, n, size=min(cfg.batch, n)))
        prev = torch.full((len(idx), 1, 4), -1, dtype=torch.long)
        h, _ = net.trunk(obs[idx][:, None, :], prev, torch.zeros(len(idx), 1))
        step = net.act(h[:, 0], feasible[idx], actions=actions[idx])
        wt = weight[idx]
        # (a batch of weight-0 rows alone would divide by zero and poison the net with NaN)
        loss = -(wt * step.log_prob).sum() / wt.sum().clamp_min(1e-8)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(float(loss.detach()))
    net.eval()
    return {"offline/loss": float(np.mean(losses[-20:]))}


def offline_update(
    policy: Policy,
    experience: Sequence[Experience],
    features: Mapping[str, StateFeatures],
    cfg: OfflineConfig,
    *,
    rng: np.random.Generator,
    limits: ActionLimits | None = None,
) -> dict[str, float]:
    """Advantage-weighted regression steps on the usable records; returns metrics."""
    enc, stats = prepare(policy, experience, features, cfg, limits)
    return {**stats, **fit(policy, enc, cfg, rng=rng)}
