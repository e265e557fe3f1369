"""Where Airflow finds this repo's DAGs and plugin: the settings, without setting anything on import.

Airflow needs ``AIRFLOW__CORE__DAGS_FOLDER`` and ``AIRFLOW__CORE__PLUGINS_FOLDER`` pointed at the clone's
``dags/`` and ``plugins/``. The Makefile exports them for its targets (``make airflow``, ``make run``,
``make test``); in a shell, export them yourself, or let this module print the lines::

    eval "$(python -m sluice.airflow.defaults)"   # from an editable install (`make setup`) of a clone

Values already in the environment win. Stdlib only.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path


def repo_root() -> Path | None:
    """The clone this package runs from (an editable install), or None for an installed copy."""
    repo = Path(__file__).resolve().parents[3]
    return repo if (repo / "dags").is_dir() and (repo / "pyproject.toml").is_file() else None


def airflow_env(environ: Mapping[str, str] | None = None, repo: Path | None = None) -> dict[str, str]:
    """The ``AIRFLOW__CORE__*`` variables to add to ``environ`` (default: ``os.environ``) so Airflow loads
    ``repo``'s DAGs and plugin; variables already set are left out. Empty when there is no clone."""
    environ = os.environ if environ is None else environ
    repo = repo or repo_root()
    if repo is None:
        return {}
    wanted = {
        "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(repo / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    return {key: value for key, value in wanted.items() if key not in environ}


def main() -> int:
    if repo_root() is None:
        print("sluice is not installed from a clone: set AIRFLOW__CORE__DAGS_FOLDER and "
              "AIRFLOW__CORE__PLUGINS_FOLDER to your dags/ and plugins/ folders", file=sys.stderr)
        return 1
    for key, value in airflow_env().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
