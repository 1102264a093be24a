"""A Valkey server of a bench's own, started the way `services up` starts the embedded one (AOF with
`appendfsync always`, on 127.0.0.1), its data in a temporary directory. Imported by bench scripts,
which put bench/common/ on sys.path."""
from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator

import valkey

from deltadrain.dev.services import valkey_binary


@contextlib.contextmanager
def own_valkey(port: int) -> Iterator[tuple[valkey.Valkey, str]]:
    """(a client, the data directory) of a server on `port`, stopped and deleted after the block."""
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen([str(valkey_binary()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "yes", "--appendfsync", "always", "--dir", data],
                                  stdout=subprocess.DEVNULL)
        try:
            client = valkey.Valkey(port=port)
            for _ in range(50):
                try:
                    client.ping()
                    break
                except valkey.ConnectionError:
                    time.sleep(0.1)
            yield client, data
        finally:
            server.terminate()
            server.wait()
