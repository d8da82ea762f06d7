"""The audit as a script for spark-submit:

    spark-submit --master spark://HOST:PORT audit/job_main.py --input DIR [--out DIR]

Same arguments and exit status as `raftlog audit run`; the master and resources come from
spark-submit unless --master is given. The driver's Python must have raftlog installed
(PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON pointing at its environment).
"""

from __future__ import annotations

import sys

from raftlog.audit.cli_run import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
