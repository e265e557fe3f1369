"""Point Airflow at this repo's DAGs and plugins, unless the user configured otherwise.

Loaded at interpreter start-up through a ``.pth`` file that ``make setup`` writes into the venv, so that a
fresh ``AIRFLOW_HOME`` (after nothing but ``airflow db migrate``) runs ``airflow dags test <dag_id> <date>``
from the repo root with the venv active. Only defaults are set: an explicit ``AIRFLOW__CORE__*`` variable
or airflow.cfg value given through the environment always wins. Must stay import-light (stdlib only).
"""

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[3]

if (_REPO / "dags").is_dir():
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(_REPO / "dags"))
    os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(_REPO / "plugins"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
