"""Airflow plugin: sluice's window ledger, Data Docs and status inside the Airflow UI.

Mounts a small FastAPI app on the API server at ``/sluice`` (see ``sluice.airflow.web``; every route needs
an Airflow user who may read DAGs):

* ``/sluice/ledger``: a status bar of windows per pipeline (with failed checks, links to the DAG runs that
  closed and validated them, and backfill / re-check actions through Airflow's REST API as the user),
  watermark and lag per stream, records per hour;
* ``/sluice/api/...``: the JSON behind it (``/sluice/api/status`` is ``sluice status --json``);
* ``/sluice/docs/...`` serves the Great Expectations Data Docs from the lake's ``_data_docs/`` (a folder or a
  bucket);
* ``/sluice/status`` returns ``sluice status`` (watermarks, ledger, row counts) as plain text;

and adds them to the UI's Browse menu. The ledger has a ``url_route``, so the UI shows it inside its own
frame at ``/plugin/sluice-ledger``; the others open as plain links.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

from sluice.airflow.web import LazyApp


class SluicePlugin(AirflowPlugin):
    name = "sluice"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [{"app": LazyApp(), "url_prefix": "/sluice", "name": "sluice"}]
    external_views: ClassVar[list[dict[str, Any]]] = [
        {"name": "Window ledger", "href": "/sluice/ledger", "url_route": "sluice-ledger", "destination": "nav",
         "category": "browse"},
        {"name": "Data Docs", "href": "/sluice/docs/index.html", "destination": "nav", "category": "browse"},
        {"name": "sluice status", "href": "/sluice/status", "destination": "nav", "category": "browse"},
    ]
