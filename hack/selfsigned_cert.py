#!/usr/bin/env python3
"""Write a self-signed TLS certificate + key (dynamiccl.testing.certs).

python hack/selfsigned_cert.py OUT_DIR [HOST ...]   # OUT_DIR/tls.crt, OUT_DIR/tls.key
"""

from __future__ import annotations

import sys

from dynamiccl.testing.certs import main, write_self_signed

__all__ = ["write_self_signed"]

if __name__ == "__main__":
    main(sys.argv[1:])
