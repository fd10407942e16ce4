"""Write a TLS certificate + key for local tests and benchmarks.

    python -m dynamiccl.testing.certs OUT_DIR [HOST ...]   # OUT_DIR/tls.crt, OUT_DIR/tls.key
    python hack/selfsigned_cert.py OUT_DIR [HOST ...]      # the same command

The certificate is issued as the operator issues its webhook's (operator/webhook/certs.py
`issue`: a new CA and a serving certificate), for 127.0.0.1, ::1 and localhost plus any HOST
given. tls.crt holds the serving certificate, then its CA: a server loads it as its chain,
and clients verify with ``cafile=tls.crt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dynamiccl.operator.webhook.certs import issue

LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")
DAYS = 2


def write_self_signed(out_dir: Path, hosts: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Create OUT_DIR/tls.crt (serving certificate and CA) and OUT_DIR/tls.key (owner only)."""
    bundle = issue(list(dict.fromkeys([*LOCAL_NAMES, *hosts])), days=DAYS)
    out_dir.mkdir(parents=True, exist_ok=True)
    crt, pem = out_dir / "tls.crt", out_dir / "tls.key"
    crt.write_bytes(bundle.tls_crt + bundle.ca_crt)
    pem.touch(mode=0o600)
    pem.chmod(0o600)
    pem.write_bytes(bundle.tls_key)
    return crt, pem


def main(argv: list[str]) -> None:
    """The command: OUT_DIR [HOST ...]; prints the two files' paths."""
    if not argv:
        sys.exit(__doc__)
    for p in write_self_signed(Path(argv[0]), tuple(argv[1:])):
        print(p)


if __name__ == "__main__":
    main(sys.argv[1:])
