"""`python -m sluice.cli`."""

from sluice.cli.main import console

console()
