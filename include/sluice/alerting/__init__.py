"""Alerts through Airflow notifiers: webhook and email."""
