import sys

from sluice.platform.launcher import main

sys.exit(main())
