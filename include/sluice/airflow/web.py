"""The small web app behind the Airflow plugin: Data Docs and ``sluice status`` over HTTP.

Paths are resolved per request from the environment (``SLUICE_HOME``...), so nothing is read when the
plugin is imported.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, PlainTextResponse

from sluice.config import load_settings


def create_app() -> FastAPI:
    app = FastAPI(title="sluice", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/status", response_class=PlainTextResponse)
    def status() -> str:
        from sluice.cli.status import render_status

        return render_status(load_settings())

    @app.get("/docs/{path:path}")
    def docs(path: str) -> FileResponse:
        from sluice.quality.checker import docs_dir

        root = docs_dir(load_settings()).resolve()
        target = (root / (path or "index.html")).resolve()
        # Never serve anything outside the Data Docs folder.
        if root not in target.parents and target != root:
            raise HTTPException(status_code=404)
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            raise HTTPException(status_code=404, detail=f"no Data Docs page {path!r} yet; run a pipeline first")
        return FileResponse(Path(target))

    return app
