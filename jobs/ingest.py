"""spark-submit entry point. Ingest landing streams into bronze/quarantine/dlq (SPEC 2-3). Args: stream names.

Thin on purpose: the logic lives in the `sluice` package and is shared with the CLI.
"""

import sys

from sluice.cli import main

if __name__ == "__main__":
    sys.exit(main(["ingest", *sys.argv[1:]]))
