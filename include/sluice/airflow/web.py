"""The web app behind the Airflow plugin, mounted on the API server at ``/sluice``:

* ``/ledger``: the window-ledger page (a status bar of windows per pipeline, watermark and lag per stream,
  records per hour), static HTML whose script reads the JSON API below and triggers ``sluice_backfill``
  through Airflow's own REST API with the user's session (so Airflow, not this app, decides who may act);
* ``/api/status`` (the document of ``sluice status --json``), ``/api/windows``, ``/api/streams``;
* ``/docs/...``: the Great Expectations Data Docs; ``/status``: ``sluice status`` as plain text.

Airflow does not authenticate a plugin's FastAPI app by itself, so every route depends on Airflow's own
``requires_access_dag("GET")``: the user comes from the ``Authorization: Bearer`` JWT (API clients) or the
UI's ``_token`` cookie (page navigation, the page's own fetches), and the configured auth manager must let
them read DAGs, since each pipeline is a DAG. Anonymous requests get 401, a bad token 403, a user without
DAG read access 403. Paths are resolved per request from the environment (``SLUICE_HOME``...), so nothing
is read when the plugin is imported.
"""

from __future__ import annotations

import html
import mimetypes
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.config import Settings

UI = Path(__file__).parent / "ui"


def require_reader() -> Callable[..., None]:
    """Airflow's dependency for "may read DAGs" (no dag_id: every DAG), imported late because it pulls in
    Airflow's models and API server modules."""
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return requires_access_dag("GET")


class LazyApp:
    """The app as the plugin mounts it: an ASGI app that builds the real one on its first request. Every
    Airflow process imports the plugin (task runners too, for macros and listeners), only the API server
    serves it, and Airflow's API security module pulls in the whole API server (a second or more per task)."""

    def __init__(self) -> None:
        self.app: FastAPI | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.app is None:
            self.app = create_app()  # two first requests at once may both build one: harmless
        await self.app(scope, receive, send)


def _settings() -> Settings:
    """sluice's settings for one request: the api-server's environment, with the ``aws_default`` connection's
    credentials over it (a lake on S3 is read with the same credentials as the DAGs' tasks write it)."""
    from sluice.airflow.credentials import task_settings

    return task_settings()


def create_app(reader: Callable[..., None] | None = None) -> FastAPI:
    """The plugin's app; ``reader`` replaces the access check (tests of the data only)."""
    app = FastAPI(
        title="sluice", docs_url=None, redoc_url=None, openapi_url=None,
        dependencies=[Depends(reader or require_reader())],
    )

    @app.exception_handler(StarletteHTTPException)
    async def sign_in_first(request: Request, exc: StarletteHTTPException) -> Response:
        # A browser opening the page (or a Data Docs page) without a session gets a way to sign in instead
        # of bare JSON; API clients still get the plain 401.
        if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
            from airflow.api_fastapi.app import create_auth_manager  # the API server's instance, once it has one

            login = html.escape(create_auth_manager().get_url_login(next_url=str(request.url)))
            return HTMLResponse(f'<p>Not signed in to Airflow. <a href="{login}">Sign in</a></p>', status_code=401)
        return await http_exception_handler(request, exc)

    @app.get("/ledger", response_class=HTMLResponse)
    def ledger_page() -> FileResponse:
        return FileResponse(UI / "ledger.html", media_type="text/html")

    @app.get("/api/status")
    def api_status() -> dict[str, Any]:
        from sluice.reports.status import status_data
        from sluice.storage.state import lake_state

        settings = _settings()
        return status_data(settings, lake_state(settings))

    @app.get("/api/windows")
    def api_windows(request: Request, limit: int = Query(500, ge=1, le=10_000)) -> dict[str, Any]:
        from sluice.airflow.api import windows_data

        # Root-relative links that hold wherever the app is mounted (root_path is the mount prefix).
        prefix = request.scope.get("root_path", "")
        # The Airflow UI sits where this app's mount point ("/sluice") hangs from.
        ui = prefix.removesuffix("/sluice") if prefix.endswith("/sluice") else ""
        return windows_data(_settings(), lambda page: f"{prefix}/docs/{quote(page)}", limit=limit,
                            airflow_url=lambda path: f"{ui}{path}")

    @app.get("/api/streams")
    def api_streams(hours: float = Query(24, gt=0, le=24 * 366)) -> dict[str, Any]:
        from sluice.airflow.api import streams_data

        return streams_data(_settings(), hours=hours)

    @app.get("/status", response_class=PlainTextResponse)
    def status() -> str:
        from sluice.reports.status import render_status
        from sluice.storage.state import lake_state

        settings = _settings()
        return render_status(settings, lake_state(settings))

    @app.get("/docs/{path:path}")
    def docs(path: str) -> Response:
        from sluice.quality.site import docs_site

        site = docs_site(_settings())
        missing = HTTPException(status_code=404, detail=f"no Data Docs page {path!r} yet; run a pipeline first")
        folder = site.root.local_path()
        if folder is not None:
            root = folder.resolve()
            target = (root / (path or "index.html")).resolve()
            # Never serve anything outside the Data Docs folder.
            if root not in target.parents and target != root:
                raise HTTPException(status_code=404)
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                raise missing
            return FileResponse(Path(target))
        # On object storage: the object itself (a folder's URL is its index page, as on disk).
        relative = site.relative(path or "index.html")
        if relative is None:
            raise HTTPException(status_code=404)
        data = site.read(relative)
        if data is None and not relative.endswith(".html"):
            relative, data = f"{relative}/index.html", site.read(f"{relative}/index.html")
        if data is None:
            raise missing
        media_type = mimetypes.guess_type(relative)[0] or "application/octet-stream"
        return Response(data, media_type=media_type)

    return app
