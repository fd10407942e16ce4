"""The operator e2e fixtures: the chart installed with helm, its operator running as a local
process (release.py explains how), the test's namespace labelled for the release, and the
operator's log attached to a failed test's report. Job builders and readers: jobs.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.e2e.operator.release import LOG_TAIL, RELEASE_LABEL, Release, installed


@pytest.fixture(scope="session")
def release(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart installed for this session, its operator running here (release.py)."""
    with installed(cluster, tmp_path_factory) as rel:
        yield rel


@pytest.fixture
def tuned_namespace(namespace: str, release: Release) -> str:
    """The test's namespace, labelled so that this release's webhook and policy see it."""
    k8s.CoreV1Api(release.api).patch_namespace(
        namespace, {"metadata": {"labels": {RELEASE_LABEL: release.name}}}
    )
    return namespace


_RELEASE_KEY = pytest.StashKey[Release]()


@pytest.fixture(autouse=True)
def _remember_release(request: pytest.FixtureRequest) -> None:
    if "release" in request.fixturenames:
        request.node.stash[_RELEASE_KEY] = request.getfixturevalue("release")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    rel = item.stash.get(_RELEASE_KEY, None)
    if rel is not None and report.failed and call.when in ("setup", "call"):
        report.sections.append((f"operator log (last {LOG_TAIL} lines)", rel.log_tail()))
    return report
