"""The commands about the pipelines folder: ``pipelines`` lists what it registers, ``plan`` what an edit to a
pipeline changes (SPEC 9), ``new-pipeline`` scaffolds a pipeline file."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from sluice.cli.common import EXIT_FAILED, EXIT_OK, Output, settings_of


def cmd_pipelines(args: argparse.Namespace) -> Output:
    from sluice.cli.describe import describe_registry, registry_data

    settings = settings_of(args)
    code = EXIT_FAILED if settings.registry.errors and args.strict else EXIT_OK
    if args.json:
        return Output(code, "", registry_data(settings))
    return Output(code, describe_registry(settings), {})


def cmd_plan(args: argparse.Namespace) -> Output:
    from sluice.runtime.context import open_run
    from sluice.streaming.changes import plan_pipeline

    settings = settings_of(args, writes=False)
    names = [args.pipeline] if args.pipeline else sorted(settings.registry.pipelines)
    pipelines = [settings.pipeline(name) for name in names]  # an unknown name fails before any JVM starts
    ctx = open_run(settings, app_name="sluice-plan")
    plans = [plan_pipeline(ctx, pipeline) for pipeline in pipelines]
    return Output(EXIT_OK, "\n".join(p.render() for p in plans), {"pipelines": [p.to_json() for p in plans]})


def cmd_new_pipeline(args: argparse.Namespace) -> int:
    from sluice.cli.scaffold import scaffold

    settings = settings_of(args)
    registry = settings.registry
    declared = {stream: p.source or registry.path for p in registry.pipelines.values() for stream in p.streams}
    done = scaffold(args.name, settings.pipelines_path, tests_dir=Path(args.tests) if args.tests else None,
                    stream=args.stream, landing_root=settings.landing.local_path(),
                    declared_streams=declared)

    def shown(path: Path) -> str:  # relative to the working directory when under it: what a user types
        with contextlib.suppress(ValueError):
            return str(path.absolute().relative_to(Path.cwd()))
        return str(path)

    for path in done.files:
        print(f"created {shown(path)}")
    for folder in done.landing:
        print(f"landing {shown(folder)}/  (the stream's files go here; a file's mtime is its arrival time)")
    print(f"next: edit {shown(done.files[0])}, then `sluice pipelines` and `sluice run {args.name}`")
    return EXIT_OK
