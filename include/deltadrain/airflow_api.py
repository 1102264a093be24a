"""A small client of Airflow's REST API v2 (authenticated), for the demo, the CLI and the tests.

Only the standard library: it runs where Airflow is not importable. Values go in JSON bodies and
quoted path segments, never into command lines.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from deltadrain.errors import DeltadrainError

FINISHED = {"success", "failed"}


class AirflowApiError(DeltadrainError):
    pass


# Longer than the embedded Airflow's wait for its SQLite write lock (orchestration.airflow_db, 60 s): a
# request that waits there behind the DAG processor's write is slow, not lost.
REQUEST_TIMEOUT = 90
RETRIES_ON_500 = 3
IDEMPOTENT = {"GET", "PATCH", "PUT", "DELETE"}


@dataclass
class AirflowApi:
    base_url: str
    username: str
    password: str = field(repr=False)
    _token: str | None = field(default=None, repr=False)

    def _request(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        req = urllib.request.Request(self.base_url.rstrip("/") + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:
                text = resp.read()
                return resp.status, (json.loads(text) if text else {})
        except urllib.error.HTTPError as exc:
            text = exc.read()
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, {"detail": text.decode("utf-8", "replace")[:500]}
        except OSError as exc:  # refused, unresolvable, timed out: no HTTP answer at all
            raise AirflowApiError(f"cannot reach Airflow's REST API at {self.base_url}: "
                                  f"{getattr(exc, 'reason', None) or exc}") from exc

    def token(self) -> str:
        if self._token is None:
            status, body = self._request("POST", "/auth/token", {"username": self.username,
                                                                 "password": self.password}, auth=False)
            if status not in (200, 201) or "access_token" not in body:
                raise AirflowApiError(f"Airflow refused the login of '{self.username}' ({status}): {body}")
            self._token = body["access_token"]
        return self._token

    def call(self, method: str, path: str, body: dict | None = None, ok=(200, 201)) -> dict:
        status, out = self._request(method, path, body)
        # A write that lost the embedded SQLite's lock rolls back and answers 500: a read or an idempotent
        # write is asked again; a POST is not (its first attempt may have been the one that landed).
        for _ in range(RETRIES_ON_500 if method in IDEMPOTENT else 0):
            if status != 500:
                break
            time.sleep(1)
            status, out = self._request(method, path, body)
        if status not in ok:
            raise AirflowApiError(f"{method} {path} -> {status}: {out.get('detail', out)}")
        return out

    @staticmethod
    def _q(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> dict:
        """Until the DAG processor has parsed `dag_id` (the API knows it)."""
        deadline = time.monotonic() + timeout
        while True:
            status, body = self._request("GET", f"/api/v2/dags/{self._q(dag_id)}")
            if status == 200:
                return body
            if time.monotonic() > deadline:
                raise AirflowApiError(f"Airflow has not loaded DAG {dag_id} after {timeout:.0f}s ({status})")
            time.sleep(2)

    def unpause(self, dag_id: str) -> None:
        self.call("PATCH", f"/api/v2/dags/{self._q(dag_id)}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict | None = None, logical_date: str | None = None) -> str:
        body = self.call("POST", f"/api/v2/dags/{self._q(dag_id)}/dagRuns",
                         {"logical_date": logical_date, "conf": conf or {}})
        return body["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.call("GET", f"/api/v2/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}")["state"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 900) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.run_state(dag_id, run_id)
            if state in FINISHED:
                return state
            if time.monotonic() > deadline:
                raise AirflowApiError(f"run {run_id} of {dag_id} still {state} after {timeout:.0f}s")
            time.sleep(3)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        body = self.call("GET", f"/api/v2/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances")
        return {t["task_id"]: t["state"] for t in body["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1):
        body = self.call("GET", f"/api/v2/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances/"
                                f"{self._q(task_id)}/xcomEntries/return_value?map_index={map_index}&deserialize=true")
        value = body.get("value")
        return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value

    def wait_for_drain(self, dag_id: str, timeout: float = 900) -> tuple[str, dict]:
        """(run id, drain summary) of the first run of an ingest DAG whose drain task succeeded.

        An unpaused DAG also runs on its schedule, and max_active_runs=1 lines runs up: the
        scheduled run may be the one that drains what a manual trigger was meant for."""
        deadline = time.monotonic() + timeout
        while True:
            for run in reversed(self.runs(dag_id)):
                if self.task_states(dag_id, run["dag_run_id"]).get("drain") == "success":
                    return run["dag_run_id"], self.xcom(dag_id, run["dag_run_id"], "drain")
                if run["state"] == "failed":
                    raise AirflowApiError(f"run {run['dag_run_id']} of {dag_id} failed: "
                                          f"{self.task_states(dag_id, run['dag_run_id'])}")
            if time.monotonic() > deadline:
                raise AirflowApiError(f"no drain of {dag_id} succeeded within {timeout:.0f}s")
            time.sleep(3)

    def runs(self, dag_id: str, run_type: str | None = None) -> list[dict]:
        query = "?order_by=-run_after&limit=100" + (f"&run_type={self._q(run_type)}" if run_type else "")
        return self.call("GET", f"/api/v2/dags/{self._q(dag_id)}/dagRuns{query}")["dag_runs"]


def embedded_api(cfg) -> AirflowApi:
    """The client of the embedded `airflow standalone` with its generated admin login."""
    from deltadrain.config.embedded import airflow_login, ports

    user, password = airflow_login()
    if password is None:
        from deltadrain.paths import command_line

        raise AirflowApiError(f"the embedded Airflow has no login yet: run `{command_line('services up', cfg.source_file)}` "
                              "first")
    return AirflowApi(f"http://127.0.0.1:{ports(cfg).airflow}", user, password)
