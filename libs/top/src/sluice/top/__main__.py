import sys

from sluice.top.cli import main

sys.exit(main())
