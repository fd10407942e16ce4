"""Self-managed webhook certificates: issue, verify, rotate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cryptography import x509

from dynamiccl.operator.webhook import certs

NAMES = [*certs.service_names("dynamiccl-webhook", "dynamiccl-system"), "127.0.0.1"]


def test_issued_bundle_is_good_and_covers_names() -> None:
    b = certs.issue(NAMES)
    assert certs.needs_rotation(b, NAMES) is None
    cert = x509.load_pem_x509_certificate(b.tls_crt)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "dynamiccl-webhook.dynamiccl-system.svc" in san.get_values_for_type(x509.DNSName)
    again = certs.Bundle.from_secret_data(b.secret_data())
    assert again == b


def test_rotation_reasons() -> None:
    assert certs.needs_rotation(None, NAMES) == "no certificate yet"
    old = certs.issue(NAMES, now=datetime.now(UTC) - timedelta(days=360))
    assert "expires" in (certs.needs_rotation(old, NAMES) or "")
    b = certs.issue(NAMES[:1])
    assert "does not cover" in (certs.needs_rotation(b, NAMES) or "")
    other = certs.issue(NAMES)
    mixed = certs.Bundle(ca_crt=other.ca_crt, tls_crt=b.tls_crt, tls_key=b.tls_key)
    assert "not issued by the CA" in (certs.needs_rotation(mixed, NAMES[:1]) or "")
    assert certs.Bundle.from_secret_data({"tls.crt": "x"}) is None
