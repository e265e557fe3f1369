"""The production topology on one machine: PostgreSQL for Airflow, an S3 server with the lake and the landing
zone, a Spark standalone cluster and Airflow's own components, started and stopped from the project's files
(``make platform`` / ``make platform-down``; :mod:`sluice.platform.launcher`)."""
