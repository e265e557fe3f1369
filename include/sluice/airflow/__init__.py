"""Airflow glue: the DAG factory and operator, the plugin's web app, and the defaults that point
Airflow at this repo. Import-light: ``defaults`` runs in every interpreter of the venv.
"""
