"""Compile tables for any registered model version: fetch its `.npz` from the ingest process.

Retrained models live on the experience volume, which only the ingest
Deployment mounts; it serves them (`GET /v1/models/<version>.npz`,
operator/ingest/model_serve.py) to the operator's own ServiceAccount. `RegistryCompiler`
is a `job_table.Compiler`: the shipped version compiles locally as before; any
other version is fetched once with the operator's token (re-read per fetch:
projected tokens rotate), checked (`NumpyPolicy.load`, and the source digest the
ingest vouches for) and kept in a small LRU of loaded models. A version that
cannot be had raises `job_table.ModelUnavailable`: the job gets NCCL's choice
with the reason, and the version is asked for again after `retry_after_s`.

`https_fetch` is the one HTTP adapter (urllib, TLS trusting the ingest CA);
tests replace it with their own function.
"""

from __future__ import annotations

import importlib
import logging
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller.job_table import (
    SHIPPED_MODEL_VERSION,
    Compiler,
    ModelUnavailable,
    shipped_compiler,
)

log = logging.getLogger("dynamiccl.operator.controller.model_fetch")

SA_TOKEN_FILE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"
MODELS_PATH: Final = "/v1/models/"
SOURCE_HEADER: Final = "X-DynamICCL-Model-Sha256"  # the registry's digest of the version's .pt
MAX_MODEL_BYTES: Final = 64 * 1024 * 1024
VERSION_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class FetchError(Exception):
    """The model could not be fetched; the message says why (short, for the table's reason)."""


@dataclass(frozen=True)
class Fetched:
    """A model archive as the ingest served it."""

    data: bytes
    source_sha256: str  # the registry's digest (header); "" if absent


# (url, bearer token, CA PEM, timeout seconds) -> the archive; raises FetchError.
Fetch = Callable[[str, str, str, float], Fetched]


def model_url(ingest_url: str, version: str) -> str:
    """`<scheme>://<host>[:port]/v1/models/<version>.npz` from the ingest URL (any path)."""
    parts = urllib.parse.urlsplit(ingest_url)
    return urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc, f"{MODELS_PATH}{urllib.parse.quote(version)}.npz", "", "")
    )


def https_fetch(url: str, token: str, ca_pem: str, timeout_s: float) -> Fetched:
    """GET `url` with a bearer token; TLS verified against `ca_pem` (system CAs if empty)."""
    ctx = ssl.create_default_context(cadata=ca_pem or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:
            data = resp.read(MAX_MODEL_BYTES + 1)
            source = resp.headers.get(SOURCE_HEADER, "")
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode(errors="replace").strip()
        raise FetchError(f"ingest answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        raise FetchError(f"ingest unreachable: {why}") from None
    if len(data) > MAX_MODEL_BYTES:
        raise FetchError(f"model archive larger than {MAX_MODEL_BYTES} bytes")
    return Fetched(data, source)


def load_npz(data: bytes) -> Any:
    """`NumpyPolicy.load` on the archive's bytes."""
    numpy_policy = importlib.import_module("dynamiccl.policy.runtime.numpy_policy")
    return numpy_policy.NumpyPolicy.load(data=data)


class RegistryCompiler:
    """A `job_table.Compiler` for every registered version (thread-safe)."""

    def __init__(
        self,
        ingest_url: str,
        *,
        token_file: Path = Path(SA_TOKEN_FILE),
        ca: Callable[[], str] = lambda: "",
        fetch: Fetch = https_fetch,
        shipped: Compiler | None = None,
        compile_table: Callable[[Any, StateFeatures, NCCLTuningPolicySpec], Any] | None = None,
        max_models: int = 4,
        retry_after_s: float = 30.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ingest_url = ingest_url
        self.token_file = token_file
        self._ca = ca
        self._fetch = fetch
        self._shipped = shipped if shipped is not None else shipped_compiler()
        self._compile_table = compile_table
        self._max = max_models
        self._retry_after = retry_after_s
        self._timeout = timeout_s
        self._clock = clock
        self._models: OrderedDict[str, Any] = OrderedDict()
        self._failed: dict[str, tuple[float, str]] = {}  # version -> (until, why)
        self._lock = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}
        self.fetches = 0

    def __call__(
        self, features: StateFeatures, policy: NCCLTuningPolicySpec, model_version: str
    ) -> Any:
        if model_version == SHIPPED_MODEL_VERSION:
            return None if self._shipped is None else self._shipped(features, policy, model_version)
        model = self.model(model_version)
        compile_table = (
            self._compile_table
            or importlib.import_module("dynamiccl.policy.runtime.compile").compile_table
        )
        return compile_table(model, features, policy)

    def model(self, version: str) -> Any:
        """The loaded model of `version` (LRU); ModelUnavailable(why) when it cannot be had."""
        if version == SHIPPED_MODEL_VERSION:
            raise ModelUnavailable("the shipped model is compiled locally")
        if not VERSION_RE.fullmatch(version):
            raise ModelUnavailable("not a valid version name")
        with self._lock:
            if version in self._models:
                self._models.move_to_end(version)
                return self._models[version]
            failed = self._failed.get(version)
            if failed is not None and failed[0] > self._clock():
                raise ModelUnavailable(failed[1])
            gate = self._fetching.setdefault(version, threading.Lock())
        with gate:  # one fetch per version at a time; the others wait for its result
            with self._lock:
                if version in self._models:
                    return self._models[version]
            try:
                model = self._get(version)
            except ModelUnavailable as exc:
                log.warning("model %s unavailable (NCCL's choice, retried later): %s", version, exc)
                with self._lock:
                    self._failed[version] = (self._clock() + self._retry_after, str(exc))
                raise
            with self._lock:
                self._failed.pop(version, None)
                self._models[version] = model
                while len(self._models) > self._max:
                    self._models.popitem(last=False)
            log.info("model %s fetched from the ingest and loaded", version)
            return model

    def _get(self, version: str) -> Any:
        if not self.ingest_url:
            raise ModelUnavailable("no --ingest-url: retrained models cannot be fetched")
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise ModelUnavailable(f"token {self.token_file}: {exc.strerror}") from None
        self.fetches += 1
        try:
            got = self._fetch(model_url(self.ingest_url, version), token, self._ca(), self._timeout)
        except FetchError as exc:
            raise ModelUnavailable(str(exc)) from None
        try:
            model = load_npz(got.data)
        except Exception as exc:  # ModelError and anything a corrupt archive raises
            msg = str(exc).split(": ", 1)[-1]
            raise ModelUnavailable(f"not a usable model archive: {msg}") from None
        recorded = getattr(model, "source_sha256", None) or ""
        if got.source_sha256 and recorded != got.source_sha256:
            raise ModelUnavailable(
                f"archive exported from {recorded[:12] or 'an unknown model'}, "
                f"registry digest {got.source_sha256[:12]}"
            )
        return model
