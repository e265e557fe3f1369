"""The one spark-submit entry point of sluice: the arguments are a `sluice` command line, e.g.
`run <pipeline> --skip-quality`, `check <pipeline> --no-deliver` or `backfill <pipeline> --start .. --end ..`.

Thin on purpose: the logic lives in the `sluice` package and is shared with the CLI.
"""

import sys

from sluice.cli.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
