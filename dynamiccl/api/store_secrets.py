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


def _password_span(url: str, start: int) -> list[tuple[int, int]]:
    """The userinfo's password: from the first ``:`` after ``scheme://`` to the LAST ``@``.
    Wider than libpq (which ends the userinfo at the first ``@`` or ``/``): a raw ``@``,
    ``/`` or ``?`` in a password is taken whole."""
    at = url.rfind("@", start)
    colon = url.find(":", start, at) if at >= 0 else -1
    return [(colon + 1, at)] if 0 <= colon < at - 1 else []


def _parameter_spans(url: str, start: int) -> list[tuple[int, int]]:
    """Values of secret parameters: a pair ``key=value`` after any ``?`` or ``&`` (so also
    inside a raw password or after a raw ``?`` in a value: more found, never less), its
    value running to the next ``&``."""
    spans: list[tuple[int, int]] = []
    for pos in (i + 1 for i in range(start, len(url)) if url[i] in "?&"):
        end = url.find("&", pos)
        end = len(url) if end < 0 else end
        key, sep, value = url[pos:end].partition("=")
        if sep and value and "?" not in key and _secret_key(key):
            spans.append((pos + len(key) + 1, end))
    return spans


def _secret_key(key: str) -> bool:
    """A parameter name libpq reads as one of ``SECRET_PARAMETERS`` (it decodes %XX)."""
    return unquote(key).strip().lower() in SECRET_PARAMETERS


def _spans(url: str) -> list[tuple[int, int]]:
    """Where the URL's secrets are (no ``://``: a file path, none)."""
    start = url.find("://")
    if start < 0:
        return []
    return _password_span(url, start + 3) + _parameter_spans(url, start + 3)


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets a store URL carries, as written in it (empty: none)."""
    return tuple(url[a:b] for a, b in _spans(url))


def carries_secret(url: str) -> bool:
    """Does the URL carry a password or another secret (so it belongs in a Secret)?"""
    return bool(_spans(url))


def redact_store_url(url: str) -> str:
    """The URL with every secret replaced by ``***``: what logs and messages show."""
    merged: list[list[int]] = []
    for a, b in sorted(_spans(url)):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out, pos = [], 0
    for a, b in merged:
        out += [url[pos:a], REDACTED]
        pos = b
    return "".join([*out, url[pos:]])


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
