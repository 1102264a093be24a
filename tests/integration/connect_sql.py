"""Run SQL statements on a Spark Connect server on 127.0.0.1, as a client process of its own (a test
process that runs a local Spark driver cannot also be a Connect client: pyspark's rule).

    connect_sql.py PORT STATEMENT...
"""

from __future__ import annotations

import sys

from deltadrain.runtime.session import connect_session


def main(port: str, *statements: str) -> None:
    session = connect_session(f"sc://127.0.0.1:{port}", purpose="test SQL")
    try:
        for statement in statements:
            session.sql(statement).collect()
    finally:
        session.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
