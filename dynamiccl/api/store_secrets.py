"""Where a credential hides in a store URL, and the URL (or a message about it) without it.

A PostgreSQL URL (libpq's URI form) carries secrets in two places:

- the userinfo's password: ``postgresql://user:PASSWORD@host/db``;
- query parameters libpq reads as secrets, in any case and with percent-encoded names
  (libpq decodes ``pass%77ord`` to ``password``): ``SECRET_PARAMETERS``.

``url_secrets`` finds them (as written and as libpq decodes them), ``redact_store_url``
replaces each by ``***`` in the URL, ``redact_message`` in any text about it (libpq may
echo the URL, or a decoded value, in its errors). Where the URL is ambiguous (a raw ``@``
or ``?`` in a password) more is replaced, never less. The chart refuses the same URLs in
``store.url`` (charts/dynamiccl/templates/ingest.yaml) and the learning loop never writes
one into a Job's spec (operator/learning/retrain.py).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote, unquote, unquote_plus

REDACTED: Final = "***"

# libpq's connection parameters that are secrets (libpq 18 marks password, sslpassword and
# oauth_client_secret with dispchar "*", the SCRAM keys are derived from the password) or
# name a file of secrets (passfile: passwords; sslkeylogfile: where libpq writes the TLS
# session keys). tests/unit/api/test_store_secrets.py checks the list against the libpq
# psycopg loads.
SECRET_PARAMETERS: Final = frozenset(
    {
        "password",
        "sslpassword",
        "oauth_client_secret",
        "scram_client_key",
        "scram_server_key",
        "passfile",
        "sslkeylogfile",
    }
)


def _split(url: str) -> tuple[int, str, str]:
    """(offset of the part after ``scheme://``, its userinfo, its query). Wider than libpq
    (which ends the userinfo at the first ``@`` or ``/``): the userinfo runs to the LAST
    ``@``, so a raw ``@``, ``/`` or ``?`` in a password is taken whole; the query starts at
    the first ``?`` after it. No ``://``: a file path, no secrets."""
    start = url.find("://")
    if start < 0:
        return len(url), "", ""
    start += 3
    rest = url[start:]
    at = rest.rfind("@")
    userinfo = rest[:at] if at >= 0 else ""
    after = rest[at + 1 :]
    query = after.split("?", 1)[1] if "?" in after else ""
    return start, userinfo, query


def _password(userinfo: str) -> str:
    return userinfo.split(":", 1)[1] if ":" in userinfo else ""


def _query_secrets(query: str) -> list[str]:
    out: list[str] = []
    for pair in query.split("&"):
        key, sep, value = pair.partition("=")
        if sep and value and unquote(key).strip().lower() in SECRET_PARAMETERS:
            out.append(value)
    return out


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets a store URL carries, as written in it (empty: none)."""
    _, userinfo, query = _split(url)
    found = [_password(userinfo), *_query_secrets(query)]
    return tuple(s for s in found if s)


def carries_secret(url: str) -> bool:
    """Does the URL carry a password or another secret (so it belongs in a Secret)?"""
    return bool(url_secrets(url))


def redact_store_url(url: str) -> str:
    """The URL with every secret replaced by ``***``: what logs and messages show."""
    start, userinfo, query = _split(url)
    password = _password(userinfo)
    out = url
    if password:
        cut = start + len(userinfo) - len(password)
        out = out[:cut] + REDACTED + out[cut + len(password) :]
    if query:
        pairs = []
        for pair in query.split("&"):
            key, sep, value = pair.partition("=")
            secret = sep and value and unquote(key).strip().lower() in SECRET_PARAMETERS
            pairs.append(f"{key}={REDACTED}" if secret else pair)
        out = out[: len(out) - len(query)] + "&".join(pairs)
    return out


def _forms(secret: str) -> set[str]:
    """A secret as written, as a reader may have decoded it, and percent-encoded."""
    plain = unquote(secret)
    return {f for f in (secret, plain, unquote_plus(secret), quote(plain, safe="")) if f}


def redact_message(text: str, url: str) -> str:
    """``text`` (an error message about ``url``) without any of the URL's secrets, in any of
    their forms, wherever they appear."""
    out = text.replace(url, redact_store_url(url))
    forms = {f for s in url_secrets(url) for f in _forms(s)}
    for form in sorted(forms, key=len, reverse=True):  # longest first: no partial leftovers
        out = out.replace(form, REDACTED)
    return out
