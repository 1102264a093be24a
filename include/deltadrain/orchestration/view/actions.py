"""The view's one action, "Replay selected": the selected DEAD entries become replay DAG confs, checked
against the DLQ, and each is triggered through Airflow's REST API with the caller's own token."""

from __future__ import annotations

import urllib.parse

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.names import REPLAY_DAG

MAX_SELECTED = 1000  # entries per action (the replay job handles them on the driver)
MAX_RUNS = 20  # id-less entries each need a run of their own; more in one click is a mistake


class SelectionError(ValueError):
    pass


def parse_entry(value: str) -> tuple[str, str]:
    """A checkbox value `partition@position` -> (partition, position). Positions never hold '@'."""
    partition, sep, position = value.rpartition("@")
    if not sep or not partition or not position:
        raise SelectionError(f"not an entry: {value!r} (expected partition@position)")
    return partition, position


def selection_to_confs(pipeline: str, selected: list[tuple[str, str]],
                       dead: dict[tuple[str, str], str | None]) -> list[dict]:
    """The replay DAG confs that replay exactly the selected DEAD entries.

    `dead`: (partition, position) -> message id of the pipeline's DEAD entries now. Entries with a
    message id go in one run by `message_ids` (every DEAD letter of those ids goes back: they are
    the same business message, and the drain's MERGE keeps one row). Id-less entries (a malformed
    message has no id) are addressed by partition and a one-position range, one run each.
    """
    keys = list(dict.fromkeys(selected))
    if not keys:
        raise SelectionError("nothing selected")
    if len(keys) > MAX_SELECTED:
        raise SelectionError(f"{len(keys)} entries selected; at most {MAX_SELECTED} per replay")
    gone = [f"{p}@{pos}" for p, pos in keys if (p, pos) not in dead]
    if gone:
        raise SelectionError(f"not DEAD (already replayed, or unknown): {', '.join(gone[:5])}"
                             + (f" and {len(gone) - 5} more" if len(gone) > 5 else ""))
    ids = sorted({found for k in keys if (found := dead[k])})
    idless = sorted(k for k in keys if not dead[k])
    if len(idless) + (1 if ids else 0) > MAX_RUNS:
        raise SelectionError(f"{len(idless)} selected entries have no message id and need one run each; "
                             f"select at most {MAX_RUNS - (1 if ids else 0)} of them at a time")
    confs = []
    if ids:
        confs.append({"pipeline": pipeline, "mode": "dlq", "message_ids": ids,
                      "limit": min(MAX_SELECTED * 10, 100_000), "dry_run": False})
    for partition, position in idless:
        confs.append({"pipeline": pipeline, "mode": "dlq", "partition": partition, "position_from": position,
                      "position_to": position, "limit": 1, "dry_run": False})
    return confs


def same_origin(headers: dict[str, str], host: str) -> bool:
    """Origin (or, without it, Referer) names the host the request was sent to."""
    source = headers.get("origin") or headers.get("referer")
    if not source or source == "null":
        return False
    return urllib.parse.urlsplit(source).netloc == host


def trigger_replays(cfg: DeltadrainConfig, pipeline: PipelineConfig, selected: list[tuple[str, str]],
                    token: str | None, base_url: str, requested_by: str | None = None) -> dict:
    """Validate the selection against the DLQ, then trigger one replay run per conf with the caller's token;
    each conf names who asked (`requested_by`, the Airflow user)."""
    from deltadrain.airflow_api import AirflowApi, AirflowApiError
    from deltadrain.heal.replay import parse_request
    from deltadrain.observe import tables as lakeview

    confs = [{**conf, "requested_by": requested_by}
             for conf in selection_to_confs(pipeline.name, selected, lakeview.dead_letter_keys(cfg, pipeline))]
    for conf in confs:
        parse_request(cfg, conf)  # the DAG validates again; failing here keeps a bad click from making runs
    api = AirflowApi(base_url, "", "", _token=token)
    runs: list[str] = []
    for conf in confs:
        status, body = api._request("POST", f"/api/v2/dags/{REPLAY_DAG}/dagRuns", {"logical_date": None,
                                                                                     "conf": conf})
        if status not in (200, 201):
            raise AirflowApiError(f"Airflow refused the replay run ({status}): {body.get('detail', body)}"
                                  + (f"; runs already triggered: {runs}" if runs else ""))
        runs.append(body["dag_run_id"])
    return {"dag_id": REPLAY_DAG, "runs": runs, "confs": confs}
