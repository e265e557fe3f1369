"""Airflow glue: the DAG factory and operator, the plugin's web app, and the defaults that point
Airflow at this repo (``python -m sluice.airflow.defaults`` prints them as ``export`` lines). Import-light:
the plugin is imported by every Airflow process.
"""
