"""``python -m miner.scan``: the worker process that scans one model (see ``miner.scan.scan``)."""

import sys

from miner.scan.scan import worker_main

sys.exit(worker_main())
