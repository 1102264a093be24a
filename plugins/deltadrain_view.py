"""Airflow plugin: mounts deltadrain's operator view (logic in deltadrain.orchestration.view) under
/deltadrain, adds a "deltadrain" entry to the UI's navigation and a "deltadrain" tab to every DAG's
page (an ingest DAG's tab shows its pipeline)."""

from airflow.plugins_manager import AirflowPlugin

from deltadrain.orchestration.view.app import EXTERNAL_VIEWS, URL_PREFIX, create_app


class DeltadrainViewPlugin(AirflowPlugin):
    name = "deltadrain_view"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "deltadrain"}]
    # url_route: the UI shows the pages inside its own frame, at /plugin/deltadrain (navigation) and
    # /dags/<dag id>/plugin/deltadrain-pipeline (the DAG's tab).
    external_views = EXTERNAL_VIEWS
