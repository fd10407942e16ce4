"""dynamiccl.testing.waiting.wait_for: a 404 is "not yet", any other API error is raised at
once, and a wait that runs out says what it waited for and what it saw last."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from dynamiccl.testing.waiting import wait_for


def test_a_404_is_not_yet_and_the_first_truthy_value_is_returned() -> None:
    answers: list[object] = [ApiException(status=404), None, {}, {"ready": True}]

    def poll() -> dict[str, bool] | None:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got  # type: ignore[return-value]

    assert wait_for("ready", poll, timeout=5, every=0) == {"ready": True}
    assert answers == []


def test_another_api_error_is_raised_at_once() -> None:
    def poll() -> None:
        raise ApiException(status=403)

    with pytest.raises(ApiException):
        wait_for("x", poll, timeout=5, every=0)


def test_running_out_names_what_and_the_last_value() -> None:
    with pytest.raises(TimeoutError, match=r"waiting for the pod \(last: \[\]\)"):
        wait_for("the pod", list, timeout=0.05, every=0.01)
