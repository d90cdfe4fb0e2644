import sys

from miner.cli import main

sys.exit(main())
