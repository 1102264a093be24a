"""Airflow glue: triggers, sensors, operators and the DAG factory.

The only part of deltadrain that imports Airflow. The triggerer imports the triggers from here
(it does not load DAG files), and dags/ only calls the factory.
"""

__all__ = ["airflow_db", "factory", "operators", "pools", "sensors", "triggers", "view"]
