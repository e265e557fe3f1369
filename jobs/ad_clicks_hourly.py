"""spark-submit entry point. One cycle of ad_clicks_hourly: ingest impressions+clicks, then the stateful
join/window query, in one Spark application.

Thin on purpose: the logic lives in the `sluice` package and is shared with the CLI.
"""

import sys

from sluice.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", "ad_clicks_hourly", *sys.argv[1:]]))
