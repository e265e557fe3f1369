"""Airflow plugin: sluice's Data Docs and status inside the Airflow UI.

Mounts a small FastAPI app on the API server at ``/sluice``:

* ``/sluice/docs/...`` serves the Great Expectations Data Docs from ``$SLUICE_HOME/data_docs``;
* ``/sluice/status`` returns ``sluice status`` (watermarks, ledger, row counts) as plain text;

and adds "Data Docs" and "sluice status" links to the UI's Browse menu.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

from sluice.airflow.web import create_app


class SluicePlugin(AirflowPlugin):
    name = "sluice"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [{"app": create_app(), "url_prefix": "/sluice", "name": "sluice"}]
    external_views: ClassVar[list[dict[str, Any]]] = [
        {"name": "Data Docs", "href": "/sluice/docs/index.html", "destination": "nav", "category": "browse"},
        {"name": "sluice status", "href": "/sluice/status", "destination": "nav", "category": "browse"},
    ]
