"""Discovery of user pipelines: every ``*.py`` file not starting with ``_`` in the pipelines folder.

The folder is ``SLUICE_PIPELINES`` (YAML key ``pipelines_path``), default ``pipelines/`` at the repo root.
Each file is imported on its own; the :class:`~sluice.core.api.Pipeline` objects it defines at module level are
registered. A broken file (an import error, an invalid definition, a name clash, a stream declared twice
differently) is recorded as a :class:`LoadError` naming the file and the problem, and never stops the
other files from loading: ``sluice run other`` and the other pipelines' DAGs keep working.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from sluice.core.api import Pipeline, Stream
from sluice.core.errors import ConfigError
from sluice.core.model import PipelineDef, StreamSpec

log = logging.getLogger("sluice.registry")

REPO_ROOT = Path(__file__).resolve().parents[3]


def default_pipelines_path() -> Path:
    """``pipelines/`` at the repo root (where the examples ship), else in the working directory."""
    shipped = REPO_ROOT / "pipelines"
    return shipped if shipped.is_dir() else Path.cwd() / "pipelines"


@dataclass(frozen=True)
class LoadError:
    """A pipeline file that could not be loaded, and why (a message that says what to fix)."""

    file: Path
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


@dataclass
class Registry:
    """The pipelines and streams declared in one pipelines folder."""

    path: Path
    pipelines: dict[str, PipelineDef] = field(default_factory=dict)
    streams: dict[str, StreamSpec] = field(default_factory=dict)
    declared: dict[str, Pipeline] = field(default_factory=dict)
    errors: list[LoadError] = field(default_factory=list)

    def pipeline(self, name: str) -> PipelineDef:
        """The pipeline, or an error that says what is known, or why the file that may hold it is broken."""
        try:
            return self.pipelines[name]
        except KeyError:
            pass
        broken = [e for e in self.errors if e.file.stem == name or f"'{name}'" in e.message]
        if broken:
            raise ConfigError(f"pipeline {name!r} could not be loaded: {broken[0]}")
        known = ", ".join(sorted(self.pipelines)) or "none"
        hint = f"; {len(self.errors)} file(s) failed to load (see `sluice pipelines`)" if self.errors else ""
        raise ConfigError(
            f"unknown pipeline {name!r}; choose one of: {known} (pipelines folder {self.path}){hint}"
        )

    def pipelines_reading(self, stream: str) -> list[str]:
        return sorted(name for name, p in self.pipelines.items() if stream in p.streams)


def _module_name(path: Path) -> str:
    return "sluice_user_pipelines." + re.sub(r"\W", "_", path.stem)


def _import(path: Path) -> ModuleType:
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    # Python workers cannot import this module by name: a UDF defined in a pipeline file must travel by value.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


def _describe_exception(exc: BaseException, path: Path) -> str:
    """The exception, with the line of the pipeline file it came from (not sluice's own frames)."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename) == path:
            where = f" (line {frame.lineno})"
            break
    return f"{type(exc).__name__}{where}: {exc}"


_lock = threading.Lock()
_cache: dict[tuple[object, ...], Registry] = {}


def _signature(folder: Path) -> tuple[object, ...]:
    if not folder.is_dir():
        return (str(folder), None)
    files = []
    for f in sorted(folder.glob("*.py")):
        stat = f.stat()
        files.append((f.name, stat.st_mtime_ns, stat.st_size))
    return (str(folder), tuple(files))


def load_registry(path: Path | str | None = None, *, fresh: bool = False) -> Registry:
    """Import the pipelines folder (cached until a file in it changes)."""
    folder = Path(path).absolute() if path else default_pipelines_path().absolute()
    key = _signature(folder)
    with _lock:
        if not fresh and key in _cache:
            return _cache[key]
        registry = _load(folder)
        _cache[key] = registry
        return registry


def _load(folder: Path) -> Registry:
    registry = Registry(folder)
    if not folder.is_dir():
        registry.errors.append(LoadError(folder, "the pipelines folder does not exist; create it, or point "
                                                 "SLUICE_PIPELINES (YAML: pipelines_path) at your pipelines"))
        return registry
    stream_origin: dict[str, tuple[Stream, Path]] = {}
    # A pipeline file may import helpers (e.g. shared streams in `_streams.py`) from its own folder.
    added = str(folder) not in sys.path
    if added:
        sys.path.insert(0, str(folder))
    try:
        for file in sorted(folder.glob("*.py")):
            if file.name.startswith(("_", ".")):
                continue
            try:
                module = _import(file)
            except Exception as exc:
                registry.errors.append(LoadError(file, _describe_exception(exc, file)))
                continue
            found = [v for v in vars(module).values() if isinstance(v, Pipeline)]
            found = list({id(p): p for p in found}.values())
            if not found:
                registry.errors.append(LoadError(
                    file, "defines no sluice.Pipeline; assign one at module level, e.g. `pipeline = Pipeline(...)`,"
                          " or start the file name with '_' if it only holds helpers"))
                continue
            problem = _clash(registry, found, stream_origin, file)
            if problem:
                registry.errors.append(LoadError(file, problem))
                continue
            for pipeline in found:
                for stream in pipeline.streams:
                    stream_origin.setdefault(stream.name, (stream, file))
                    registry.streams.setdefault(stream.name, StreamSpec.from_stream(stream))
                registry.declared[pipeline.name] = pipeline
                registry.pipelines[pipeline.name] = PipelineDef.from_pipeline(pipeline, file)
    finally:
        if added and str(folder) in sys.path:
            sys.path.remove(str(folder))
    for error in registry.errors:
        log.warning("pipeline file failed to load: %s", error)
    return registry


def _clash(
    registry: Registry, found: list[Pipeline], streams: dict[str, tuple[Stream, Path]], file: Path
) -> str | None:
    names = [p.name for p in found]
    if len(set(names)) != len(names):
        return f"declares pipeline {names[0]!r} twice; give each Pipeline its own name"
    for pipeline in found:
        if pipeline.name in registry.pipelines:
            other = registry.pipelines[pipeline.name].source
            return (f"pipeline name {pipeline.name!r} is already declared in {other}; pipeline names must be "
                    "unique (they are DAG ids and table names)")
        outputs = {o.name: p for p in registry.pipelines.values() for o in p.outputs}
        for output in pipeline.outputs:
            if output.name in outputs:
                return (f"output {output.name!r} of pipeline {pipeline.name!r} is already written by pipeline "
                        f"{outputs[output.name].name!r} ({outputs[output.name].source}); each gold table has "
                        "one owner, rename the output")
        for stream in pipeline.streams:
            if stream.name in streams and streams[stream.name][0] != stream:
                other_file = streams[stream.name][1]
                return (f"stream {stream.name!r} is declared differently in {other_file}; a stream shared by "
                        "several pipelines must have one definition (put it in a module such as "
                        "`_streams.py` and import it from both files)")
    return None


__all__ = ["LoadError", "Registry", "default_pipelines_path", "load_registry"]
