"""The `sluice` command line (`sluice.cli:console`, which runs :func:`main`)."""

from sluice.cli.main import build_parser, console, main

__all__ = ["build_parser", "console", "main"]
