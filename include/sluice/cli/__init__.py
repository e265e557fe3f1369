"""The `sluice` command line (`sluice.cli:main`)."""

from sluice.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
