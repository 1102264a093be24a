"""The REST client asks again after the embedded Airflow's 500 for an idempotent request, never for a POST."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deltadrain import airflow_api
from deltadrain.airflow_api import AirflowApi, AirflowApiError


@pytest.fixture
def server(monkeypatch):
    """A local HTTP server that answers 500 to the first `fail` requests of each method, then 200."""
    monkeypatch.setattr(airflow_api.time, "sleep", lambda s: None)
    seen: list[str] = []
    fail = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            seen.append(self.command)
            code = 500 if sum(1 for m in seen if m == self.command) <= fail["n"] else 200
            body = json.dumps({"detail": "Database error"} if code == 500 else {"ok": True}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PATCH = do_POST = _answer

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    api = AirflowApi(f"http://127.0.0.1:{httpd.server_address[1]}", "admin", "pw", _token="t")
    yield api, seen, fail
    httpd.shutdown()


def test_an_idempotent_request_is_asked_again_after_a_500(server):
    api, seen, fail = server
    fail["n"] = 2
    assert api.call("PATCH", "/api/v2/dags/d", {"is_paused": False}) == {"ok": True}
    assert seen == ["PATCH"] * 3


def test_a_post_is_not_repeated_and_a_lasting_500_is_an_error(server):
    api, seen, fail = server
    fail["n"] = 1
    with pytest.raises(AirflowApiError, match="500: Database error"):
        api.call("POST", "/api/v2/dags/d/dagRuns", {})
    assert seen == ["POST"]
    fail["n"] = 10
    with pytest.raises(AirflowApiError, match="500"):
        api.call("GET", "/api/v2/dags/d")
    assert seen.count("GET") == 1 + airflow_api.RETRIES_ON_500
