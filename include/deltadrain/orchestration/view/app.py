"""The view's FastAPI app, which Airflow's API server mounts (plugins/deltadrain_view.py): its routes,
their authorization and the pages' templates; what they show comes from `data`, the replay action
from `actions`.

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
"""

from __future__ import annotations

import logging
import urllib.parse
from datetime import datetime
from pathlib import Path

from fastapi import Request  # module level: FastAPI resolves the (postponed) annotations in this module

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.names import REPLAY_DAG, ingest_dag_id
from deltadrain.orchestration.view.actions import (
    MAX_RUNS,
    SelectionError,
    parse_entry,
    same_origin,
    trigger_replays,
)
from deltadrain.orchestration.view.charts import WINDOW_NAMES, WINDOWS, charts_svg, pipeline_charts, window_of
from deltadrain.orchestration.view.data import _jsonable, pipeline_summaries, pipeline_view
from deltadrain.orchestration.view.runs import alerts_of

log = logging.getLogger(__name__)

URL_PREFIX = "/deltadrain"
TEMPLATES = Path(__file__).resolve().parents[2] / "resources" / "view"
STATIC = TEMPLATES / "static"
STATIC_FILES = {"theme.js": "text/javascript", "icon.svg": "image/svg+xml", "icon-dark.svg": "image/svg+xml"}
# The plugin's views in Airflow's UI (plugins/deltadrain_view.py): the navigation entry, and a tab on
# every DAG's page that shows the pipeline of an ingest DAG ({DAG_ID} is filled in by the UI).
EXTERNAL_VIEWS = [
    {"name": "deltadrain", "href": f"{URL_PREFIX}/", "destination": "nav", "url_route": "deltadrain",
     "nav_top_level": True, "icon": f"{URL_PREFIX}/static/icon.svg", "icon_dark_mode": f"{URL_PREFIX}/static/icon-dark.svg"},
    {"name": "deltadrain", "href": f"{URL_PREFIX}/dags/{{DAG_ID}}", "destination": "dag",
     "url_route": "deltadrain-pipeline"},
]


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
    if tls and base_url and base.netloc:
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
    from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

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

    def window_arg(window: str) -> str:
        name = window_of(window)
        if name is None:
            raise HTTPException(400, f"window must be one of {', '.join(WINDOWS)}")
        return name

    def overview(user) -> list[dict]:
        cfg = load_cfg()
        return pipeline_summaries(cfg, [p for p in cfg.pipelines if readable(user, p)])

    @app.get("/static/{name}")
    def static(name: str, user=user_dep):
        """The pages' one script (it follows Airflow's light or dark theme) and the navigation's icons:
        served here, nothing comes from the internet."""
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no {name!r}")
        return Response((STATIC / name).read_text(), media_type=STATIC_FILES[name],
                        headers={"Cache-Control": "private, max-age=300"})

    @app.get("/", response_class=HTMLResponse)
    def index(user=user_dep):
        return templates.get_template("index.html.j2").render(pipelines=overview(user), static="static")

    @app.get("/dags/{dag_id}", response_class=HTMLResponse)
    def dag_tab(dag_id: str, user=user_dep):
        """The tab on a DAG's page: an ingest DAG's pipeline page; any other DAG is named as none."""
        cfg = load_cfg()
        pipeline = next((p for p in cfg.pipelines if ingest_dag_id(p.name) == dag_id), None)
        if pipeline is not None:
            find(cfg, pipeline.name, user)
            return RedirectResponse(f"../pipelines/{urllib.parse.quote(pipeline.name)}", status_code=303)
        return templates.get_template("not_ingest.html.j2").render(
            dag_id=dag_id, pipelines=[p.name for p in cfg.pipelines if readable(user, p)], static="../static")

    @app.get("/api/pipelines/{name}/charts")
    def charts_json(name: str, user=user_dep, window: str = "1d"):
        """The pipeline's chart series over the last day (1d) or week (7d)."""
        cfg = load_cfg()
        pipeline = find(cfg, name, user)
        return JSONResponse(_jsonable(pipeline_charts(cfg, pipeline, window_arg(window))))

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
        data = pipeline_view(cfg, pipeline, state_arg(state), max(1, min(limit, 1000)))
        return JSONResponse(_jsonable({**data, "alerts": alerts_of(pipeline)}))

    @app.get("/pipelines/{name}", response_class=HTMLResponse)
    def pipeline_page(name: str, user=user_dep, state: str = "DEAD", limit: int = 100, triggered: str = "",
                      window: str = "1d"):
        cfg = load_cfg()
        pipeline = find(cfg, name, user)
        window = window_arg(window)
        data = pipeline_view(cfg, pipeline, state_arg(state), max(1, min(limit, 1000)))
        data["alerts"] = alerts_of(pipeline)
        try:
            chart = pipeline_charts(cfg, pipeline, window)
            charts, chart_runs = charts_svg(chart), chart["runs"]
            chart_from = datetime.fromisoformat(chart["from"])
        except Exception:  # the page still shows the counts
            log.exception("deltadrain view: the charts of pipeline %s could not be read", pipeline.name)
            charts, chart_runs, chart_from = [], None, None
        return templates.get_template("pipeline.html.j2").render(
            v=data, state=state, replay_dag=REPLAY_DAG, triggered=[r for r in triggered.split(",") if r][:MAX_RUNS],
            static="../static", window=window, window_name=WINDOW_NAMES[window], windows=WINDOW_NAMES,
            charts=charts, chart_runs=chart_runs, chart_from=chart_from)

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
            result = await run_in_threadpool(trigger_replays, cfg, pipeline, selected, token, airflow_base_url(),
                                             user.get_name() if hasattr(user, "get_name") else None)
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
