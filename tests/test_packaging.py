"""sluice is an installable package: its declared dependencies cover what it imports, and ``pip install .``
into a fresh venv gives a working ``sluice`` command."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

import sluice

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
FIRST_PARTY = {"sluice", "sluice_tools"}
# Shipped packages: sluice (include/) and sluice_tools (tools/, the generator and demo `sluice` runs).
SOURCES = [REPO / "include" / "sluice", REPO / "tools" / "sluice_tools"]
# Imported only by modules that need the `airflow` extra (the DAG factory, notifiers, the plugin's page).
# The platform demo drives Airflow's scheduler (its REST API, `airflow backfill create`): it needs the extra.
AIRFLOW_EXTRA_MODULES = ("sluice/airflow/", "sluice/alerting/", "sluice_tools/platform_demo.py")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return _normalize(match.group(1))


def _guards_imports(node: ast.Try) -> bool:
    """A try whose handlers catch ImportError (or anything broader): the imports in its body are optional."""
    for handler in node.handlers:
        caught = handler.type
        names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if caught is None or any(isinstance(n, ast.Name) and n.id in {"ImportError", "ModuleNotFoundError",
                                                                      "Exception", "BaseException"} for n in names):
            return True
    return False


def _third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level module -> the files importing it (absolute imports that are not stdlib or first party)."""
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) and _guards_imports(t)
                    for stmt in t.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in optional:  # `try: import x / except ImportError:` -- works without it
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in FIRST_PARTY or top == "__future__":
                    continue
                found.setdefault(top, set()).add(path.relative_to(root.parent).as_posix())
    return found


def test_declared_dependencies_cover_imports() -> None:
    """Every third-party module the shipped code imports comes from a declared distribution: a base
    dependency, or the `airflow` extra when only Airflow glue imports it."""
    project = PYPROJECT["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    airflow = base | {_requirement_name(r) for r in project["optional-dependencies"]["airflow"]}
    dists = packages_distributions()
    imports: dict[str, set[str]] = {}
    for root in SOURCES:
        for module, files in _third_party_imports(root).items():
            imports.setdefault(module, set()).update(files)
    assert {"pyspark", "deltalake", "great_expectations", "yaml", "airflow"} <= set(imports)  # the scan works
    missing = []
    for module, files in sorted(imports.items()):
        providers = {_normalize(d) for d in dists.get(module, [])}
        assert providers, f"{module} (imported by {sorted(files)}) is not installed in this venv"
        needs_base = any(not f.startswith(AIRFLOW_EXTRA_MODULES) for f in files)
        declared = base if needs_base else airflow
        if not providers & declared:
            missing.append(f"{module} ({'base' if needs_base else 'airflow extra'}; imported by {sorted(files)})")
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_declared_dependencies_have_ranges_and_lock_satisfies_them() -> None:
    """Ranges, not pins, in pyproject.toml; the exact lock (requirements.txt) sits inside every range."""
    from packaging.requirements import Requirement

    lock = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            lock[_normalize(name)] = version
    project = PYPROJECT["project"]
    requirements = [*project["dependencies"], *(r for rs in project["optional-dependencies"].values() for r in rs)]
    for text in requirements:
        requirement = Requirement(text)
        assert "==" not in str(requirement.specifier), f"{text}: declare a range; requirements.txt pins"
        name = _normalize(requirement.name)
        assert name in lock, f"{text}: not in the lock (requirements.txt)"
        assert requirement.specifier.contains(lock[name], prereleases=True), f"{text}: lock has {lock[name]}"
    assert not any(_requirement_name(r) in {"duckdb", "polars"} for r in project["dependencies"])


def _python311() -> str:
    return shutil.which("python3.11") or sys.executable


@pytest.mark.slow
def test_pip_install_into_fresh_venv(tmp_path: Path) -> None:
    """`pip install .` (pinned to the lock with -c requirements.txt, so no resolution surprises) into a
    fresh venv, without this venv's packages: the `sluice` command starts and lists the pipelines."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    ignore = shutil.ignore_patterns("*.egg-info", "__pycache__", "*.pyc")
    for folder in ("include", "tools"):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "SLUICE_", "AIRFLOW", "PYSPARK"))}
    subprocess.run([_python311(), "-m", "venv", str(venv)], check=True, env=env, timeout=300)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-c", str(REPO / "requirements.txt"), str(src)],
        env=env, capture_output=True, text=True, timeout=1500,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    # Only the declared dependencies were installed: no Airflow, no test tools.
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                            env=env, capture_output=True, text=True, check=True).stdout
    installed = {_normalize(line.split("==")[0]) for line in listed.splitlines() if "==" in line}
    assert {"sluice", "pyspark", "deltalake", "great-expectations", "pandas", "pyyaml"} <= installed
    assert not installed & {"apache-airflow", "apache-airflow-core", "duckdb", "polars", "pytest"}

    sluice_bin = str(venv / "bin" / "sluice")
    env["SLUICE_HOME"] = str(tmp_path / "home")
    version = subprocess.run([sluice_bin, "--version"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr
    assert sluice.__version__ in version.stdout
    pipelines = subprocess.run([sluice_bin, "pipelines", "--pipelines", str(REPO / "pipelines")], env=env,
                               cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert pipelines.returncode == 0, pipelines.stdout + pipelines.stderr
    assert "ad_clicks_hourly" in pipelines.stdout and "user_activity_hourly" in pipelines.stdout
    # The installed copy is the one that ran, not this clone's include/.
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import sluice; print(sluice.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert where.strip().startswith(str(venv))
    # Package data: the plugin's page and the Spark JVM's log4j2 configuration.
    installed_pkg = Path(where.strip()).parent
    assert (installed_pkg / "runtime" / "log4j2.properties").is_file()
    assert list((installed_pkg / "airflow" / "ui").glob("*.html"))
