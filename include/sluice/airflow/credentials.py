"""Object-storage credentials under Airflow (SPEC 1): the ``aws_default`` connection, when it is defined; and
Kafka's servers and security (SPEC 2): the ``kafka_default`` connection.

A team that runs Airflow keeps its AWS credentials in a connection, in the Amazon provider's format: the access
key as ``login``, the secret as ``password``, and ``region_name``, ``endpoint_url`` (or ``service_config.s3
.endpoint_url``) and ``aws_session_token`` in ``extra``. sluice reads it with Airflow's own connection lookup
(environment variable, secrets backend or metadata database; the provider itself is not needed) and hands its
values on as the standard AWS variables, which every sluice process reads: the task's settings, and the
environment of the spark-submit jobs. Its values win over the worker's own variables, as with the provider's
hooks. Airflow masks the connection's secret in task logs and rendered fields.

``kafka_default`` is the Apache Kafka provider's connection type: its extra holds the client's properties as
confluent-kafka takes them (``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``, ``sasl.username``,
``sasl.password``, ...). They become ``SLUICE_KAFKA_*`` variables the same way (``sluice.config.loading``'s
``kafka_properties`` reads them back); Airflow masks extra fields named like secrets (``password``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluice.config import Settings, load_settings

AWS_CONN_ID = "aws_default"
KAFKA_CONN_ID = "kafka_default"


def aws_env(conn_id: str = AWS_CONN_ID) -> dict[str, str]:
    """The standard AWS variables the connection ``conn_id`` defines; empty when it is not defined."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return {}
    return connection_env(connection.login, connection.password, connection.extra_dejson)


def connection_env(login: str | None, password: str | None, extra: Mapping[str, Any] | None) -> dict[str, str]:
    """The AWS variables of a connection in the Amazon provider's format."""
    extra = dict(extra or {})
    service = (extra.get("service_config") or {}).get("s3") or {}
    values = {
        "AWS_ACCESS_KEY_ID": login or extra.get("aws_access_key_id"),
        "AWS_SECRET_ACCESS_KEY": password or extra.get("aws_secret_access_key"),
        "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
        "AWS_REGION": extra.get("region_name"),
        "AWS_ENDPOINT_URL": service.get("endpoint_url") or extra.get("endpoint_url"),
    }
    return {name: str(value) for name, value in values.items() if value}


def kafka_env(conn_id: str = KAFKA_CONN_ID) -> dict[str, str]:
    """The ``SLUICE_KAFKA_*`` variables of the connection ``conn_id``; empty when it is not defined."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return {}
    return kafka_connection_env(connection.extra_dejson)


def kafka_connection_env(extra: Mapping[str, Any] | None) -> dict[str, str]:
    """A ``kafka`` connection's extra (client properties) as ``SLUICE_KAFKA_<PROPERTY>`` variables."""
    out = {}
    for name, value in dict(extra or {}).items():
        if value is None or value == "":
            continue
        key = "BOOTSTRAP" if name == "bootstrap.servers" else name.upper().replace(".", "_")
        out[f"SLUICE_KAFKA_{key}"] = str(value)
    return out


def task_settings(*, home: str | Path | None = None) -> Settings:
    """sluice's settings in a task: the worker's environment, with the ``aws_default`` connection's
    credentials and the ``kafka_default`` connection's properties over it."""
    return load_settings({**os.environ, **aws_env(), **kafka_env()}, home=home)
