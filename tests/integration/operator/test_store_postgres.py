"""The experience-store contract against SQLite AND a real PostgreSQL server.

Every `test_*` of tests/unit/operator/store/test_experience.py, test_experience_jobs.py,
test_step_times.py, store/test_registry.py, test_knob_loop.py, test_rollup.py and
store/test_arms.py runs here twice: on a SQLite file and on a throw-away PostgreSQL 15
server this module starts (dynamiccl/testing/postgres.py: initdb + postgres in a temp dir
on a free port, as user `nobody` when run as root). Needs the Debian `postgresql-15`
package (or PG_BIN pointing at PostgreSQL's bin directory).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dynamiccl.api.experience import read_experience
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.migrations import Dialect
from dynamiccl.testing import postgres as pg_server

ROOT = Path(__file__).resolve().parents[3]


def load_by_path(path: Path, name: str) -> ModuleType:
    """Import a helper that is not on sys.path (tests use --import-mode=importlib)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


store_suite = load_by_path(
    ROOT / "tests/unit/operator/store/test_experience.py", "dynamiccl_store_suite"
)
store_jobs_suite = load_by_path(
    ROOT / "tests/unit/operator/store/test_experience_jobs.py", "dynamiccl_store_jobs_suite"
)
step_suite = load_by_path(
    ROOT / "tests/unit/operator/store/test_step_times.py", "dynamiccl_step_suite"
)
registry_suite = load_by_path(
    ROOT / "tests/unit/operator/store/test_registry.py", "dynamiccl_registry_suite"
)
knob_suite = load_by_path(
    ROOT / "tests/unit/operator/learning/test_knob_loop.py", "dynamiccl_knob_suite"
)
rollup_suite = load_by_path(
    ROOT / "tests/unit/operator/store/test_rollup.py", "dynamiccl_rollup_suite"
)
arms_suite = load_by_path(ROOT / "tests/unit/operator/store/test_arms.py", "dynamiccl_arms_suite")

# The shared suites: same test functions, this module's `store_url` fixture.
make_store = store_suite.make_store
make_registry = registry_suite.make_registry
store = knob_suite.store
_SUITES = (store_suite, store_jobs_suite, step_suite, registry_suite, knob_suite, rollup_suite,
           arms_suite)  # fmt: skip
for _suite in _SUITES:
    for _name, _obj in vars(_suite).items():
        if _name.startswith("test_") and callable(_obj):
            globals()[_name] = _obj


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    if not pg_server.available():
        pytest.fail("PostgreSQL binaries missing: apt-get install postgresql-15 (or set PG_BIN)")
    with pg_server.PgServer() as pg:
        yield pg


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'experience.db'}"
    pg = request.getfixturevalue("postgres")
    pg.reset()
    return str(pg.url)


def test_postgres_backend_is_really_postgres(postgres: Any) -> None:
    postgres.reset()
    s = open_store(postgres.url)
    try:
        assert s.backend.dialect is Dialect.POSTGRES
        with s.backend.transaction(write=False) as cur:
            cur.execute("SHOW synchronous_commit")
            row = cur.fetchone()
        assert row is not None
        assert row[0] == "on"  # a returned commit is durable
        assert "postgres@" in s.backend.display_url
    finally:
        s.close()


def test_training_reader_on_postgres(postgres: Any) -> None:
    postgres.reset()
    s = open_store(postgres.url)
    try:
        for seq in range(3):
            s.insert_batch(store_suite.make_batch(seq))
        rows = list(read_experience(postgres.url, page=2))
        assert rows == s.experience_since(0)
        assert len(rows) == 9
        assert [r.id for r in read_experience(postgres.url, after_id=rows[4].id)] == [
            r.id for r in rows[5:]
        ]
    finally:
        s.close()
