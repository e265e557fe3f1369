"""spark-submit entry point. One cycle of user_activity_hourly: ingest events, then the chained 10-min -> hourly
windows, in one Spark application.

Thin on purpose: the logic lives in the `sluice` package and is shared with the CLI.
"""

import sys

from sluice.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", "user_activity_hourly", *sys.argv[1:]]))
