"""Airflow glue: triggers, sensors, operators, the DAG factory and Airflow's connections.

The only part of deltadrain that imports Airflow. The triggerer imports the triggers from here
(it does not load DAG files), and dags/ only calls the factory. Importing the package makes Airflow's
connections the store behind deltadrain.secrets (`connections`): every Airflow process that runs
deltadrain's code imports it first.
"""

from deltadrain.orchestration.connections import use_airflow_connections

__all__ = ["airflow_db", "assets", "connections", "factory", "operators", "pools", "sensors", "submit", "triggers", "view"]

use_airflow_connections()
