"""NCCL's plugin ABI numbers, read from their one source: `plugin/tests/test_abi_layout.c`.

That C file asserts each number against `plugin/include/dyn_nccl_abi.h` at compile time and
prints them when run (`offset S.F N`, `member_size S.F N`, `size S N`, `value NAME N`); the
Python tests compare their ctypes declarations and enumerations with what it prints, so the
numbers are written once.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "plugin"
BINARY = PLUGIN / "build" / "test_abi_layout"


@dataclass(frozen=True)
class AbiFacts:
    """The printed table, by kind: `offset` and `member_size` keyed `struct.member`."""

    offset: dict[str, int] = field(default_factory=dict)
    member_size: dict[str, int] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
    value: dict[str, int] = field(default_factory=dict)


def parse(text: str) -> AbiFacts:
    """The table from the program's output; ValueError on a line that is not `kind NAME N`."""
    facts = AbiFacts()
    for line in text.splitlines():
        kind, name, number = line.split()
        table: dict[str, int] = getattr(facts, kind)
        if name in table:
            raise ValueError(f"{name}: listed twice")
        table[name] = int(number)
    return facts


@cache
def nccl_abi_facts() -> AbiFacts:
    """Build (make, so the asserts run) and run the C table; parse what it prints."""
    subprocess.run(["make", "-s", "-C", str(PLUGIN), "build/test_abi_layout"], check=True)
    out = subprocess.run([str(BINARY)], check=True, capture_output=True, text=True).stdout
    return parse(out)
