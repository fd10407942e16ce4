"""The operator compiles a tuned job's initial table with the shipped model without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]

CODE = """
import json, sys
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller import configmap as cm

features = StateFeatures.model_validate_json(sys.argv[1])
loaded = cm.warm_up()
table = cm.initial_table(features, NCCLTuningPolicySpec.model_validate({"mode": "learned"}),
                         cm.SHIPPED_MODEL_VERSION)
print(json.dumps({
    "warm_up": loaded,
    "cells": len(table["cells"]),
    "reason": table.get("reason"),
    "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
}))
"""


def test_operator_compiles_the_shipped_model_without_importing_torch(
    h100_job_features: dict[str, Any],
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CODE, json.dumps(h100_job_features)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["warm_up"] == "compiler and shipped model loaded"
    assert out["torch"] == []
    assert out["reason"] is None  # compiled, not the NCCL-default fallback
    assert out["cells"] > 0
