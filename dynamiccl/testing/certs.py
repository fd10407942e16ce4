"""Write a self-signed TLS certificate + key for local tests and benchmarks (cryptography).

    python -m dynamiccl.testing.certs OUT_DIR [HOST ...]   # OUT_DIR/tls.crt, OUT_DIR/tls.key
    python hack/selfsigned_cert.py OUT_DIR [HOST ...]      # the same command

The certificate is its own CA (clients verify with `cafile=tls.crt`) and names
127.0.0.1, ::1 and localhost plus any HOST given.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def write_self_signed(out_dir: Path, hosts: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Create OUT_DIR/tls.crt and OUT_DIR/tls.key (EC P-256, valid 2 days)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dynamiccl-test")])
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        x509.DNSName("localhost"),
    ]
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    crt, pem = out_dir / "tls.crt", out_dir / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pem.chmod(0o600)
    return crt, pem


def main(argv: list[str]) -> None:
    """The command: OUT_DIR [HOST ...]; prints the two files' paths."""
    if not argv:
        sys.exit(__doc__)
    for p in write_self_signed(Path(argv[0]), tuple(argv[1:])):
        print(p)


if __name__ == "__main__":
    main(sys.argv[1:])
