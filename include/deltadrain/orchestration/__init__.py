"""Airflow glue: triggers, sensors, operators, the DAG factory, Airflow's connections, and what the tasks
report to Airflow's OpenLineage provider (`lineage`) and metrics backend (`metrics`).

The only part of deltadrain that imports Airflow. The triggerer imports the triggers from here
(it does not load DAG files), and dags/ only calls the factory. Importing the package makes Airflow's
connections the store behind deltadrain.secrets (`connections`): every Airflow process that runs
deltadrain's code imports it first.
"""

from deltadrain.orchestration.connections import use_airflow_connections

__all__ = ["airflow_db", "assets", "connections", "factory", "lineage", "metrics", "operators", "pools", "sensors",
           "submit", "triggers", "view"]

use_airflow_connections()
