"""A secrets backend that is down: every lookup raises, as an unreachable Vault would."""

from __future__ import annotations

from typing import Any

from airflow.secrets import BaseSecretsBackend


class Backend(BaseSecretsBackend):
    def get_conn_value(self, conn_id: str, team_name: str | None = None) -> Any:
        raise ConnectionError(f"secrets backend unreachable while looking up {conn_id!r}")

    def get_connection(self, conn_id: str, team_name: str | None = None) -> Any:
        raise ConnectionError(f"secrets backend unreachable while looking up {conn_id!r}")

    def get_variable(self, key: str, team_name: str | None = None) -> Any:
        raise ConnectionError(f"secrets backend unreachable while looking up variable {key!r}")
