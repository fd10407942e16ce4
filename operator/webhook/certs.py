"""Self-managed webhook TLS (used when cert-manager is not installed).

A self-signed CA and a serving certificate for the webhook Service's DNS names
(and any extra IP/DNS SANs) are kept in one Secret (``ca.crt``, ``tls.crt``,
``tls.key``). ``needs_rotation`` says when the serving certificate (or the CA)
is within ``renew_before`` of expiry or no longer covers the wanted names; the
operator then issues new ones, writes the Secret and updates the
MutatingWebhookConfiguration's caBundle. Pure functions over PEM bytes.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
CERT_DAYS = 365
RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class Bundle:
    """PEM-encoded CA certificate, serving certificate and serving key."""

    ca_crt: bytes
    tls_crt: bytes
    tls_key: bytes
    ca_key: bytes = b""

    def secret_data(self) -> dict[str, str]:
        """The Secret's ``data`` (base64)."""
        raw = {"ca.crt": self.ca_crt, "tls.crt": self.tls_crt, "tls.key": self.tls_key}
        if self.ca_key:
            raw["ca.key"] = self.ca_key
        return {k: base64.b64encode(v).decode() for k, v in raw.items()}

    @classmethod
    def from_secret_data(cls, data: dict[str, str]) -> Bundle | None:
        """Parse a Secret's ``data``; None if anything is missing or not base64."""
        try:
            raw = {k: base64.b64decode(data[k]) for k in ("ca.crt", "tls.crt", "tls.key")}
            ca_key = base64.b64decode(data.get("ca.key", ""))
        except (KeyError, ValueError):
            return None
        return cls(raw["ca.crt"], raw["tls.crt"], raw["tls.key"], ca_key)


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names the apiserver may use for a Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]  # fmt: skip


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _sans(names: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def issue(names: Sequence[str], now: datetime | None = None, days: int = CERT_DAYS) -> Bundle:
    """A new CA and a serving certificate for ``names`` (DNS names or IPs)."""
    now = now or datetime.now(UTC)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dynamiccl-webhook-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_sans(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Bundle(
        ca_crt=ca.public_bytes(serialization.Encoding.PEM),
        tls_crt=cert.public_bytes(serialization.Encoding.PEM),
        tls_key=_pem_key(key),
        ca_key=_pem_key(ca_key),
    )


def needs_rotation(
    bundle: Bundle | None,
    names: Sequence[str],
    now: datetime | None = None,
    renew_before: timedelta = RENEW_BEFORE,
) -> str | None:
    """Why the bundle must be replaced, or None if it is good."""
    if bundle is None:
        return "no certificate yet"
    now = now or datetime.now(UTC)
    try:
        cert = x509.load_pem_x509_certificate(bundle.tls_crt)
        ca = x509.load_pem_x509_certificate(bundle.ca_crt)
    except ValueError:
        return "certificate is not valid PEM"
    for what, c in (("serving certificate", cert), ("CA", ca)):
        if c.not_valid_after_utc - renew_before <= now:
            return f"{what} expires {c.not_valid_after_utc.isoformat()}"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "serving certificate was not issued by the CA"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "certificate has no subjectAltName"
    have = {str(v) for v in sans.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
    missing = [n for n in names if n not in have]
    if missing:
        return f"certificate does not cover {', '.join(missing)}"
    return None


def ca_bundle_b64(bundle: Bundle) -> str:
    """The caBundle value of a webhook clientConfig."""
    return base64.b64encode(bundle.ca_crt).decode()
