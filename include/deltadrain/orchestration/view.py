"""The operator's view: a FastAPI app that Airflow's API server mounts (plugins/deltadrain_view.py).

Per pipeline: lifecycle counts (PENDING, CLAIMED, PUBLISHED, DEAD), lag, the last batches, and the
DLQ with a "Replay selected" action that triggers the replay DAG.

Security:
- plugin apps are not protected by Airflow: every route depends on Airflow's own `get_user`
  (bearer token or the UI's `_token` cookie), and pages check the user's access to the DAGs;
- the replay action checks that the user may create runs of the replay DAG, then triggers it
  through the REST API with the caller's own token, so Airflow applies the same permissions and
  its audit log names the user;
- a cookie-authenticated POST must come from the same origin (the cookie alone would let another
  site submit the form in the user's name);
- no secret is shown (source URLs and credentials are never rendered), payload previews are
  truncated and escaped by Jinja's autoescape.

Reads go through `deltadrain.lakeview` (delta-rs): no Spark JVM in the API server.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import Request  # module level: FastAPI resolves the (postponed) annotations in this module

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.orchestration.names import MAINTENANCE_DAG, REPLAY_DAG, ingest_dag_id
from deltadrain.outcome import Outcome
from deltadrain.sources import LakeSide, SourceNote, source_of

log = logging.getLogger(__name__)

URL_PREFIX = "/deltadrain"
MAX_SELECTED = 1000  # entries per action (the replay job handles them on the driver)
MAX_RUNS = 20  # id-less entries each need a run of their own; more in one click is a mistake
COMMITTED = (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED)  # the runs whose batch a quality check is of
SUMMARY_RUNS = 10  # numbered runs the index page reads per pipeline to find its last committed batch
SOURCE_WAIT_S = 10  # the longest a page waits for a source's counts (Valkey's own timeouts are 3 s)
TEMPLATES = Path(__file__).resolve().parents[1] / "resources" / "view"


class SelectionError(ValueError):
    pass


# -- pure parts ------------------------------------------------------------------------------------


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
    ids = sorted({dead[k] for k in keys if dead[k]})
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


# -- reading -----------------------------------------------------------------------------------------


def source_counts(cfg: DeltadrainConfig, pipeline: PipelineConfig, until: float | None = None) -> dict:
    """PENDING / CLAIMED from the source, with the checkpoint as delta-rs reads it. Errors are reported
    by type only (messages may hold hosts), but for what the source answered (SourceNote). `until`
    (time.monotonic()): when the source's calls give up (their own waits run to 30 s)."""
    from deltadrain import lakeview

    try:
        counts = source_of(pipeline).counts(cfg, pipeline, LakeSide(lambda: lakeview.checkpoint(cfg, pipeline)),
                                            until=until, quick=True)
    except SourceNote as exc:  # e.g. no such topic (yet), or a recreated one
        return {"PENDING": None, "CLAIMED": None, "source_note": str(exc)}
    except Exception as exc:  # the view still shows the lake side
        return {"PENDING": None, "CLAIMED": None, "source_note": f"source unreachable ({type(exc).__name__})"}
    return _claims(counts, pipeline)


def _claims(counts: dict, pipeline: PipelineConfig) -> dict:
    """What the page shows of a source's counts: totals, who holds claims (stale ones flagged), partitions,
    and the open gaps: what the next run reports (Valkey: entries removed before the group read them,
    or recorded by a run no commit carried yet; Kafka: offsets retention deleted past the checkpoint)."""
    from deltadrain import lakeview
    from deltadrain.status import mark_stale

    mark_stale(counts, source_of(pipeline).stale_after_ms(pipeline))
    return {"PENDING": counts["PENDING"], "CLAIMED": counts["CLAIMED"], "claimed_by": counts["claimed_by"],
            "oldest_claim_idle_ms": counts["oldest_claim_idle_ms"], "STALE_CLAIMED": counts["STALE_CLAIMED"],
            "stale_after_ms": counts["stale_after_ms"],
            "partitions": {k: {"pending": v["pending"], "claimed": v["claimed"]}
                           for k, v in counts["partitions"].items()},
            "open_gaps": [lakeview.gap_row(g) for g in counts.get("gaps") or []],
            "dead_runs": counts.get("dead_runs") or [], "splits": counts.get("splits") or []}


def with_checks(cfg: DeltadrainConfig, pipeline: PipelineConfig, runs: list[dict]) -> list[dict]:
    """`runs` (metrics rows), each that committed its batch given that batch's newest check as `quality`
    (None: not checked yet, and then `owed`: whether a quality task is to check it). Other runs have
    no `quality`: their number may be a later run's batch."""
    from deltadrain import lakeview

    others = [r for r in runs if r.get("batch") and r.get("outcome") not in COMMITTED]
    # A try that committed and then failed is recorded as an error: its commit names its run.
    made = lakeview.committed_runs(cfg, pipeline) if others else set()
    committed = [r for r in runs if r.get("batch") and (r.get("outcome") in COMMITTED
                                                        or (r["batch"], r.get("run_id")) in made)]
    checks = lakeview.batch_checks(cfg, pipeline, [r["batch"] for r in committed])
    for r in committed:
        r["quality"] = checks.get(r["batch"])
    if unchecked := [r for r in committed if r["quality"] is None]:
        try:
            floor = lakeview.owed_from(cfg, pipeline)
        except Exception:  # it only qualifies "not checked": the page shows the rest
            log.exception("deltadrain view: what pipeline %s owes a check could not be read", pipeline.name)
            return runs
        for r in unchecked:
            r["owed"] = floor is not None and r["batch"] >= floor
    return runs


def pipeline_summary(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict:
    """The index page's row of a pipeline: lag, dead letters, what needs a look, its last run and the
    last committed batch with its check. A lake it cannot read is said in the row, not raised: one
    pipeline must not take the index down."""
    from deltadrain import lakeview

    row = {"pipeline": pipeline.name, "source": pipeline.source.kind, "lag": None, "DEAD": None, "source_note": None,
           "lake_note": None, "stale_messages": 0, "open_gaps": 0, "last_run": None, "last_committed": None}
    with lakeview.one_read():  # in the pool's thread: each row opens its own tables once
        counts = bounded_source_counts(cfg, pipeline)
        row.update(lag=counts["PENDING"] + counts["CLAIMED"] if counts["PENDING"] is not None else None,
                   source_note=counts.get("source_note"), stale_messages=counts.get("STALE_CLAIMED") or 0,
                   open_gaps=len(counts.get("open_gaps") or []))
        try:
            last = lakeview.last_batches(cfg, pipeline, 1)
            numbered = with_checks(cfg, pipeline, lakeview.last_batches(cfg, pipeline, SUMMARY_RUNS, numbered=True))
            row.update(DEAD=lakeview.dlq_counts(cfg, pipeline).get("DEAD", 0), last_run=last[0] if last else None,
                       last_committed=next((r for r in numbered if "quality" in r), None))
        except Exception as exc:
            log.exception("deltadrain view: the lake of pipeline %s could not be read", pipeline.name)
            row["lake_note"] = f"lake unreadable ({type(exc).__name__})"
    return row


def pipeline_summaries(cfg: DeltadrainConfig, pipelines: list[PipelineConfig]) -> list[dict]:
    """pipeline_summary of each, side by side: a source that does not answer costs its wait once."""
    if len(pipelines) <= 1:
        return [pipeline_summary(cfg, p) for p in pipelines]
    with ThreadPoolExecutor(max_workers=min(8, len(pipelines))) as pool:
        return list(pool.map(lambda p: pipeline_summary(cfg, p), pipelines))


def bounded_source_counts(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict:
    """source_counts, waited for at most SOURCE_WAIT_S. Kafka's broker calls give up a second before
    (their own waits run to 30 s), so a broker that is down is named unreachable and frees its pool
    thread about when the page stops waiting; a source still past the wait is said to be slow."""
    from concurrent.futures import TimeoutError as Late

    # In the caller's context: a Kafka source reads the target's history, which the page reads too (one_read).
    until = time.monotonic() + SOURCE_WAIT_S - 1  # from the ask: the pool may start the call later
    future = _source_pool().submit(contextvars.copy_context().run, source_counts, cfg, pipeline, until)
    try:
        return future.result(timeout=SOURCE_WAIT_S)
    except Late:
        return {"PENDING": None, "CLAIMED": None, "source_note": f"source did not answer within {SOURCE_WAIT_S} s"}


@functools.cache
def _source_pool() -> ThreadPoolExecutor:
    """Where source calls run, so that a page can stop waiting for one; shared, so slow sources cannot
    pile up threads. Made on the first page, not when Airflow loads the plugin in every process."""
    return ThreadPoolExecutor(max_workers=8, thread_name_prefix="deltadrain-view-source")


def pipeline_view(cfg: DeltadrainConfig, pipeline: PipelineConfig, dlq_state: str | None = "DEAD",
                  dlq_limit: int = 100, batches: int = 10) -> dict:
    """Everything the page shows, as plain data (the JSON endpoint returns it as is)."""
    from deltadrain import lakeview

    began = time.monotonic()
    out: dict = {"pipeline": pipeline.name, "source": pipeline.source.kind,
                 "partitions": source_of(pipeline).reads(pipeline),
                 "on_gap": pipeline.source.on_gap, "ingest_dag": ingest_dag_id(pipeline.name)}
    with lakeview.one_read():
        out.update(bounded_source_counts(cfg, pipeline))
        out["PUBLISHED"] = lakeview.published_count(cfg, pipeline)
        counts = lakeview.dlq_counts(cfg, pipeline)
        out["DEAD"], out["REPLAYED"] = counts.get("DEAD", 0), counts.get("REPLAYED", 0)
        out["lag"] = (out["PENDING"] + out["CLAIMED"]) if out["PENDING"] is not None else None
        out["last_commit"] = lakeview.last_commit(cfg, pipeline)
        out["data_files"], out["maintenance_dag"] = lakeview.data_files(cfg, pipeline), MAINTENANCE_DAG
        out["gaps"] = lakeview.recorded_gaps(cfg, pipeline)
        out["last_batches"] = with_checks(cfg, pipeline, lakeview.last_batches(cfg, pipeline, batches))
        out["dead_letters"] = lakeview.dead_letters(cfg, pipeline, dlq_state, dlq_limit)
    out["read_seconds"] = round(time.monotonic() - began, 3)
    return out


# -- the app -----------------------------------------------------------------------------------------


def load_cfg() -> DeltadrainConfig:
    """The config is read per request: a pipeline added to the YAML shows without an API server restart."""
    from deltadrain.config import load_config

    return load_config()


def _templates():
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html", "j2"]))
    env.filters["num"] = lambda v: "—" if v is None else f"{v:,}" if isinstance(v, int) else v
    env.filters["ts"] = lambda v: "" if v is None else f"{v:%Y-%m-%d %H:%M:%S}"
    return env


def caller_token(request) -> tuple[str | None, bool]:
    """(the credential get_user accepted, whether it is the UI's cookie): a bearer token wins, as in get_user."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), False
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN), True


def self_api_url(host: str, port: int, base_url: str | None, tls: bool) -> str:
    """Where this API server reaches its own REST API: the address it listens on, under base_url's path
    (Airflow serves under it). Neither the browser's Host header nor base_url's host: behind Compose's
    port mapping or a proxy they name an address the server itself may not reach. With TLS the
    certificate names base_url's host, so base_url is taken as it is."""
    base = urllib.parse.urlsplit(base_url or "")
    if tls and base.netloc:
        return base_url.rstrip("/")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host.strip(), host.strip())
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{'https' if tls else 'http'}://{netloc}{base.path.rstrip('/')}"


def airflow_base_url() -> str:
    from airflow.configuration import conf

    return self_api_url(conf.get("api", "host", fallback="0.0.0.0"), conf.getint("api", "port", fallback=8080),
                        conf.get("api", "base_url", fallback=None),
                        bool(conf.get("api", "ssl_cert", fallback="")))


def create_app():
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

    from deltadrain.errors import DeltadrainError

    templates = _templates()
    # Every route needs an authenticated Airflow user: 401 without a credential, 403 for a bad one.
    app = FastAPI(title="deltadrain", dependencies=[Depends(get_user)], docs_url=None, redoc_url=None,
                  openapi_url=None)
    # A default, not an Annotated alias: with postponed annotations FastAPI could not resolve a local alias.
    user_dep = Depends(get_user)

    def auth_manager():
        from airflow.api_fastapi.app import get_auth_manager

        return get_auth_manager()

    def readable(user, pipeline: PipelineConfig) -> bool:
        return auth_manager().is_authorized_dag(method="GET", user=user,
                                                details=DagDetails(id=ingest_dag_id(pipeline.name)))

    def find(cfg: DeltadrainConfig, name: str, user) -> PipelineConfig:
        pipeline = next((p for p in cfg.pipelines if p.name == name), None)
        if pipeline is None:
            raise HTTPException(404, f"no pipeline named {name!r}")
        if not readable(user, pipeline):
            raise HTTPException(403, f"you may not read the DAGs of pipeline {name!r}")
        return pipeline

    def state_arg(state: str) -> str | None:
        if state not in ("DEAD", "REPLAYED", "all"):
            raise HTTPException(400, "state must be DEAD, REPLAYED or all")
        return None if state == "all" else state

    def overview(user) -> list[dict]:
        cfg = load_cfg()
        return pipeline_summaries(cfg, [p for p in cfg.pipelines if readable(user, p)])

    @app.get("/", response_class=HTMLResponse)
    def index(user=user_dep):
        return templates.get_template("index.html.j2").render(pipelines=overview(user))

    @app.get("/api/pipelines")
    def list_pipelines(user=user_dep):
        return {"pipelines": [p.name for p in load_cfg().pipelines if readable(user, p)]}

    @app.get("/api/overview")
    def overview_json(user=user_dep):
        """The index as JSON, one row per pipeline the user may read (monitoring scripts, alerts)."""
        return JSONResponse(_jsonable({"pipelines": overview(user)}))

    @app.get("/api/pipelines/{name}")
    def pipeline_json(name: str, user=user_dep, state: str = "DEAD", limit: int = 100):
        cfg = load_cfg()
        pipeline = find(cfg, name, user)
        return JSONResponse(_jsonable(pipeline_view(cfg, pipeline, state_arg(state), max(1, min(limit, 1000)))))

    @app.get("/pipelines/{name}", response_class=HTMLResponse)
    def pipeline_page(name: str, user=user_dep, state: str = "DEAD", limit: int = 100, triggered: str = ""):
        cfg = load_cfg()
        pipeline = find(cfg, name, user)
        data = pipeline_view(cfg, pipeline, state_arg(state), max(1, min(limit, 1000)))
        return templates.get_template("pipeline.html.j2").render(
            v=data, state=state, replay_dag=REPLAY_DAG, triggered=[r for r in triggered.split(",") if r][:MAX_RUNS])

    @app.post("/pipelines/{name}/replay")
    async def replay_selected(name: str, request: Request, user=user_dep):
        """Form (`entry` = partition@position, repeated) from the page, or JSON {"entries": [...]} from scripts."""
        cfg = load_cfg()
        pipeline = find(cfg, name, user)
        token, from_cookie = caller_token(request)
        if from_cookie and not same_origin({k.lower(): v for k, v in request.headers.items()},
                                           request.headers.get("host", "")):
            raise HTTPException(403, "cross-origin form submission refused")
        if not auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN, user=user,
                                                details=DagDetails(id=REPLAY_DAG)):
            raise HTTPException(403, f"you may not trigger runs of {REPLAY_DAG}")
        is_json = request.headers.get("content-type", "").startswith("application/json")
        if is_json:
            body = await request.json()
            values = body.get("entries", []) if isinstance(body, dict) else []
        else:
            values = (await request.form()).getlist("entry")
        from starlette.concurrency import run_in_threadpool

        try:
            selected = [parse_entry(str(v)) for v in values]
            result = await run_in_threadpool(trigger_replays, cfg, pipeline, selected, token, airflow_base_url())
        except SelectionError as exc:
            raise HTTPException(400, str(exc)) from None
        except DeltadrainError as exc:
            raise HTTPException(502, str(exc)) from None
        if is_json:
            return result
        if "runs" in result:
            log.info("view: replay of %d entries of %s triggered runs %s", len(selected), pipeline.name,
                     result["runs"])
        # Relative, so that it also works when Airflow is served under a path prefix.
        query = urllib.parse.urlencode({"triggered": ",".join(result["runs"])})
        return RedirectResponse(f"../{urllib.parse.quote(name)}?{query}", status_code=303)

    return app


def trigger_replays(cfg: DeltadrainConfig, pipeline: PipelineConfig, selected: list[tuple[str, str]],
                    token: str | None, base_url: str) -> dict:
    """Validate the selection against the DLQ, then trigger one replay run per conf with the caller's token."""
    from deltadrain import lakeview
    from deltadrain.airflow_api import AirflowApi, AirflowApiError
    from deltadrain.replay import parse_request

    confs = selection_to_confs(pipeline.name, selected, lakeview.dead_letter_keys(cfg, pipeline))
    for conf in confs:
        parse_request(cfg, conf)  # the DAG validates again; failing here keeps a bad click from making runs
    api = AirflowApi(base_url, "", "", _token=token)
    runs = []
    for conf in confs:
        status, body = api._request("POST", f"/api/v2/dags/{REPLAY_DAG}/dagRuns", {"logical_date": None,
                                                                                     "conf": conf})
        if status not in (200, 201):
            raise AirflowApiError(f"Airflow refused the replay run ({status}): {body.get('detail', body)}"
                                  + (f"; runs already triggered: {runs}" if runs else ""))
        runs.append(body["dag_run_id"])
    return {"dag_id": REPLAY_DAG, "runs": runs, "confs": confs}


def _jsonable(value):
    from datetime import datetime

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
