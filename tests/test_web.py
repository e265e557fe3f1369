"""The Airflow plugin's web app: Data Docs and status over real HTTP requests (in-process ASGI)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sluice.airflow.web import create_app


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    docs = tmp_path / "data_docs"
    (docs / "validations").mkdir(parents=True)
    (docs / "index.html").write_text("<html>sluice data docs</html>")
    (docs / "validations" / "page.html").write_text("<html>window page</html>")
    (tmp_path / "secret.txt").write_text("not for the web")
    return TestClient(create_app())


def test_serves_data_docs(client: TestClient) -> None:
    assert "sluice data docs" in client.get("/docs/index.html").text
    assert "window page" in client.get("/docs/validations/page.html").text
    assert client.get("/docs/missing.html").status_code == 404


def test_never_serves_outside_the_docs(client: TestClient) -> None:
    assert client.get("/docs/../secret.txt").status_code == 404
    assert client.get("/docs/%2e%2e/secret.txt").status_code == 404


def test_status_is_plain_text(client: TestClient) -> None:
    response = client.get("/status")
    assert response.status_code == 200
    assert "streams (where every line went)" in response.text


def test_plugin_registers_the_app() -> None:
    import importlib.util

    plugin_file = Path(__file__).parents[1] / "plugins" / "sluice_plugin.py"
    spec = importlib.util.spec_from_file_location("sluice_plugin", plugin_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = module.SluicePlugin
    assert plugin.name == "sluice"
    assert plugin.fastapi_apps[0]["url_prefix"] == "/sluice"
