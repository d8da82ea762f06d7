"""`python -m raftlog.chaos.powerfs`: the FUSE process (see server.py)."""

import sys

from raftlog.chaos.powerfs.server import main

sys.exit(main())
