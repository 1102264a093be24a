"""deltadrain's Airflow DAGs, one set per pipeline of the config ($DELTADRAIN_CONFIG or
config/pipelines.yaml).

Declarations only: the DAGs are built by deltadrain.orchestration.factory. (Airflow's safe mode
parses only files that mention both "airflow" and "dag", as this docstring does.)
"""

from deltadrain.orchestration.factory import build_dags

globals().update(build_dags())
