"""Issue 32 B: a credential anywhere in a store URL is found, redacted, and refused.

Before the fix only ``user:password@`` was seen: ``?password=`` and ``?sslpassword=``
passed ``redact_store_url`` unchanged, stayed in ``redact_message``'s text, and the learning
loop wrote such a URL into a retraining Job's spec.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dynamiccl.api.store_secrets import (
    SECRET_PARAMETERS,
    carries_secret,
    redact_message,
    redact_store_url,
    url_secrets,
)

PW = "S3cretPW"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u@db:5432/x?password={PW}",
        f"postgresql://u@db:5432/x?sslmode=require&sslpassword={PW}",
        f"postgresql://u@db:5432/x?PassWord={PW}",
        f"postgresql://u@db:5432/x?pass%77ord={PW}",  # libpq decodes the name: password
        f"postgresql://u@db:5432/x?passfile={PW}",
        f"postgresql://u@db:5432/x?oauth_client_secret={PW}",
        f"postgresql://u:{PW}@db:5432/x",
        f"postgresql://u:{PW}@db1,db2/x?application_name=a",
        f"postgres://u:{quote('p@ss/w?rd' + PW, safe='')}@db/x",
        f"postgresql://u:p@ss/w?rd{PW}@db/x",  # raw '@', '/', '?': taken whole
    ],
)
def test_every_secret_of_a_url_is_found_and_redacted(url: str) -> None:
    assert carries_secret(url)
    assert PW not in redact_store_url(url)
    assert "***" in redact_store_url(url)
    for secret in url_secrets(url):  # as written, and as libpq decodes it
        echoed = f"connection failed: {url} ({secret}, {unquote(secret)})"
        assert PW not in redact_message(echoed, url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@db:5432/x?sslmode=require&application_name=trainer",
        "postgresql://db/x",
        "postgresql://u:@db/x",  # an empty password is no secret
        "sqlite:////var/lib/dynamiccl/experience.db",
        "/var/lib/dynamiccl/experience.db",
    ],
)
def test_a_url_without_secrets_is_left_as_it_is(url: str) -> None:
    assert not carries_secret(url)
    assert redact_store_url(url) == url


def test_the_list_covers_every_secret_the_loaded_libpq_knows() -> None:
    """libpq marks its secret parameters (dispchar "*") and its debug-only ones ("D": the
    SCRAM keys, the TLS key log file); a newer libpq adding one fails this test."""
    pq = pytest.importorskip("psycopg.pq")
    marked = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar in (b"*", b"D")}
    assert marked - {"replication"} <= SECRET_PARAMETERS
    assert "passfile" in SECRET_PARAMETERS


# Characters a password can hold; what the URL carries is its percent-encoding or, where
# libpq would read it so, the raw text.
SECRET_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=6
)
KEY_CASE = st.sampled_from(sorted(SECRET_PARAMETERS)).flatmap(
    lambda k: st.tuples(st.just(k), st.lists(st.booleans(), min_size=len(k), max_size=len(k)))
)


def _spell(key: str, flips: list[bool]) -> str:
    """The parameter name in mixed case, some letters percent-encoded."""
    out = []
    for ch, flip in zip(key, flips, strict=True):
        out.append(f"%{ord(ch):02X}" if flip and ch.isalpha() and ch in "aeiou" else ch)
        if flip and ch.isalpha() and ch not in "aeiou":
            out[-1] = ch.upper()
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(
    secret=SECRET_TEXT,
    raw=st.booleans(),
    key=KEY_CASE,
    where=st.sampled_from(["userinfo", "query", "both"]),
    other=st.sampled_from(["", "sslmode=require", "application_name=trainer"]),
)
def test_a_secret_never_survives_redaction(
    secret: str, raw: bool, key: tuple[str, list[bool]], where: str, other: str
) -> None:
    encoded = quote(secret, safe="")
    in_url = secret if raw and not set(secret) & set("&#%") else encoded
    skeleton = "postgresql://trainer@db.example:5432/dynamiccl?sslmode=require"
    for form in {secret, encoded}:
        assume(form not in skeleton and form not in "***" + other)
    user = f"trainer:{in_url}@" if where != "query" else "trainer@"
    query = [other] if other else []
    if where != "userinfo":
        query.append(f"{_spell(*key)}={encoded if '&' in in_url else in_url}")
    url = f"postgresql://{user}db.example:5432/dynamiccl" + ("?" + "&".join(query) if query else "")
    assert url_secrets(url)
    redacted = redact_store_url(url)
    message = redact_message(f"error: {url}; password={secret}; raw {encoded}", url)
    for form in {secret, encoded}:
        assert form not in redacted
        assert form not in message
