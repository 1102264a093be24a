"""Airflow plugin: mounts deltadrain's operator view (logic in deltadrain.orchestration.view) under
/deltadrain and adds a "deltadrain" entry to the UI's navigation that shows it."""

from airflow.plugins_manager import AirflowPlugin

from deltadrain.orchestration.view.app import URL_PREFIX, create_app


class DeltadrainViewPlugin(AirflowPlugin):
    name = "deltadrain_view"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "deltadrain"}]
    # url_route: the UI shows the page inside its own frame at /plugin/deltadrain.
    external_views = [{"name": "deltadrain", "href": f"{URL_PREFIX}/", "destination": "nav",
                       "url_route": "deltadrain", "category": "browse"}]
