"""Placeholder for commands whose issue has not landed yet."""

from __future__ import annotations

import typer


def not_implemented(command: str, issue: int) -> None:
    """Exit non-zero with one clear line naming the command and its issue."""
    typer.echo(f"dynamiccl {command}: not implemented yet (issue #{issue})", err=True)
    raise typer.Exit(code=2)
