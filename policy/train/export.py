"""Export a trained `.pt` model to the `.npz` the torch-free policy runs (operator images).

    python -m dynamiccl.policy.train.export [--model PATH] [--out PATH]

Defaults: the shipped `policy/models/default.pt` -> the `.npz` next to the
model. The archive records the `.pt` file's sha256, so a loader can tell an
export that is stale against its `.pt`. Identical weights give identical bytes.
Bad input: one line naming the file, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dynamiccl.policy.runtime.model_file import DEFAULT_MODEL, ModelError, file_sha256


def export(model: Path, out: Path) -> None:
    """Load `model` with torch and write its numpy archive to `out`."""
    from dynamiccl.policy.train.inference import Policy  # noqa: PLC0415 - torch only here

    policy = Policy.load(model)
    policy.export_npz(out, source_sha256=file_sha256(model))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynamiccl.policy.train.export",
        description="Export a .pt policy model to .npz for inference without torch.",
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the .pt model")
    parser.add_argument("--out", type=Path, default=None, help="default: MODEL with .npz")
    args = parser.parse_args(argv)
    model: Path = args.model
    out: Path = args.out or model.with_suffix(".npz")
    if out.resolve() == model.resolve():
        print(f"error: --out {out} would overwrite the model", file=sys.stderr)
        return 2
    try:
        export(model, out)
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {out}: cannot write: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
