#!/usr/bin/env python3
"""A throw-away PostgreSQL server (dynamiccl.testing.postgres).

python hack/pg_server.py          # prints the URL, serves until Ctrl-C
"""

from __future__ import annotations

from dynamiccl.testing.postgres import PgServer, available, main

__all__ = ["PgServer", "available"]

if __name__ == "__main__":
    main()
