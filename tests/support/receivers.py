"""Receivers a test runs on 127.0.0.1 for what Airflow sends out: OpenLineage events over HTTP (the
provider's http transport) and StatsD packets over UDP. Each listens on a free port in a thread of the
test's process and keeps what arrived."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LineageReceiver:
    """An OpenLineage HTTP endpoint: every event POSTed to it, decoded, in `events`."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        events = self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # the name http.server calls
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                events.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def transport(self) -> str:
        """AIRFLOW__OPENLINEAGE__TRANSPORT for the provider's http transport to this receiver."""
        return json.dumps({"type": "http", "url": self.url, "endpoint": "api/v1/lineage"})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class StatsdReceiver:
    """A StatsD listener: every `name:value|type` line received, in `lines`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.last = time.monotonic()  # when a packet last arrived
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            self.lines += data.decode(errors="replace").splitlines()  # a client may batch lines in a packet
            self.last = time.monotonic()

    def quiet(self, idle: float = 0.5, at_most: float = 10) -> None:
        """Wait until nothing arrived for `idle` seconds: the packets a finished process sent are read."""
        deadline = time.monotonic() + at_most
        while time.monotonic() - self.last < idle and time.monotonic() < deadline:
            time.sleep(0.05)

    def env(self) -> dict[str, str]:
        """Airflow's [metrics] settings that send StatsD here."""
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.port), "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"}

    def values(self, name: str) -> list[tuple[float, str]]:
        """(value, type) of each line for the metric `name` (prefix included), once the packets stopped."""
        self.quiet()
        out = []
        for line in self.lines:
            metric, _, rest = line.partition(":")
            if metric == name:
                value, _, kind = rest.partition("|")
                out.append((float(value), kind.split("|")[0]))
        return out

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
