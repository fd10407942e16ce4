"""Item 8 of issue 19: a PostgreSQL password appears in no command line, log or error message."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dynamiccl.api.store_secrets import redact_message, redact_store_url
from dynamiccl.operator.ingest import main as ingest_main
from dynamiccl.operator.learning.retrain import RetrainSpec, StoreSecretRequired, build_retrain_job
from dynamiccl.policy.train.offline import ExperienceError, read_store

SECRET = "s3cret-Pw"
URLS = (
    f"postgresql://trainer:{SECRET}@127.0.0.1:1/dynamiccl",  # nothing listens on port 1
    f"postgresql://trainer:{SECRET}@127.0.0.1:notaport/dynamiccl",  # libpq echoes conninfo
)


def test_redaction() -> None:
    url = URLS[0]
    assert redact_store_url(url) == "postgresql://trainer:***@127.0.0.1:1/dynamiccl"
    assert redact_store_url("postgresql://db/x") == "postgresql://db/x"
    assert SECRET not in redact_message(f"failed: password={SECRET} in {url}", url)


@pytest.mark.parametrize("url", URLS)
def test_dynamiccl_train_store_errors_show_no_password(url: str) -> None:
    with pytest.raises(ExperienceError) as err:
        read_store(url)
    assert SECRET not in str(err.value)
    assert "***" in str(err.value) or "127.0.0.1" in str(err.value)


@pytest.mark.parametrize("url", URLS)
def test_ingest_start_errors_show_no_password(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DYNAMICCL_STORE_URL", url)  # how the chart passes it: not in argv
    code = ingest_main.main(["--insecure-http", "--port", "0", "--host", "127.0.0.1"])
    out = capsys.readouterr()
    assert code == 2
    assert SECRET not in out.out + out.err
    assert "ingest:" in out.err


def test_the_retraining_job_never_carries_the_password() -> None:
    spec = RetrainSpec(
        policy_name="p",
        policy_uid="u",
        namespace="ns",
        image="img",
        store_url=URLS[0],
        new_version="v2",
        parent_version="v1",
        pvc_name="store",
        store_url_secret="pg",
    )
    text = str(build_retrain_job(spec))
    assert SECRET not in text
    assert "$(DYNAMICCL_STORE_URL)" not in text  # expanded into argv by the kubelet


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://trainer@db/x?password={SECRET}",
        f"postgresql://trainer@db/x?sslmode=require&SSLPASSWORD={SECRET}",
        f"postgresql://trainer@db/x?pass%77ord={SECRET}",
        f"postgresql://trainer@db/x?passfile=/secrets/{SECRET}",
    ],
)
def test_a_secret_in_the_query_never_reaches_a_job_spec(url: str) -> None:
    """Issue 32 B: the loop refused only a userinfo password; a query secret went into the
    retraining Job's env as a plain value."""
    spec = RetrainSpec(
        policy_name="p",
        policy_uid="u",
        namespace="ns",
        image="img",
        store_url=url,
        new_version="v2",
        parent_version="v1",
        pvc_name="store",
    )
    with pytest.raises(StoreSecretRequired):
        build_retrain_job(spec)
    with_secret = build_retrain_job(replace(spec, store_url_secret="pg"))
    assert SECRET not in str(with_secret)
