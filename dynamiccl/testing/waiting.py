"""Polling the Kubernetes API until something holds, for the cluster tests and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 90, every: float = 0.5) -> T:
    """``fn()`` once it is truthy; a 404 from the API counts as "not yet". TimeoutError after
    ``timeout`` seconds, naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            got = fn()
        except ApiException as exc:
            if exc.status != 404:
                raise
        else:
            if got:
                return got
            last = got
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
