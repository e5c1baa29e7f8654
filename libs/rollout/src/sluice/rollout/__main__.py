import sys

from sluice.rollout.cli import main

sys.exit(main())
