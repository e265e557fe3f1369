"""spark-submit entry point. Great Expectations checks for windows closed but not yet validated. Args: pipeline.

Thin on purpose: the logic lives in the `sluice` package and is shared with the CLI.
"""

import sys

from sluice.cli import main

if __name__ == "__main__":
    sys.exit(main(["check", *sys.argv[1:]]))
