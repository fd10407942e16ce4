#!/usr/bin/env bash
# Run import-linter's contracts (pyproject.toml [tool.importlinter]).
#
# grimp, import-linter's graph builder, skips namespace packages, and our
# component folders are namespace packages on purpose (a regular package named
# `operator` at the repository root would shadow the standard library). So we
# lint a throw-away mirror of the package in which every folder is a regular
# package; the import statements are byte-for-byte the same files.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -rL "$here/dynamiccl" "$tmp/dynamiccl"
find "$tmp/dynamiccl" -type d -name __pycache__ -prune -exec rm -rf {} +
find "$tmp/dynamiccl" -type d ! -name '__pycache__' -exec sh -c '[ -e "$1/__init__.py" ] || : > "$1/__init__.py"' _ {} \;
cd "$tmp"
PYTHONPATH="$tmp" "$here/.venv/bin/python" -c \
  'import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))' \
  "$here/pyproject.toml"
