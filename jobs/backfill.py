"""spark-submit entry point. Recompute a range of closed windows from bronze. Args: pipeline --start TS --end TS
[--include-late].

Thin on purpose: the logic lives in the `sluice` package and is shared with the CLI.
"""

import sys

from sluice.cli import main

if __name__ == "__main__":
    sys.exit(main(["backfill", *sys.argv[1:]]))
