"""The one spark-submit entry point of sluice: the arguments are a `sluice` command line, e.g.
`run <pipeline> --skip-quality`, `check <pipeline> --no-deliver` or `backfill <pipeline> --start .. --end ..`.

Thin on purpose: the logic lives in the `sluice` package and is shared with the CLI.
"""

import sys

from sluice.cli.main import main

if __name__ == "__main__":
    # A failed task's log is where an operator looks first: it carries the whole traceback.
    sys.exit(main(["--debug", *sys.argv[1:]]))
