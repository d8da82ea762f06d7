"""`python -m raftlog.audit.export_child`: the exporter as a process of its own, which a running
node starts for an online export (node/ops/audit_export.py) on the checkpoint it took — so the
export's CPU work never holds the node's GIL. It lowers its own CPU priority first.

    python -m raftlog.audit.export_child --from CHECKPOINT_DIR --out OUT_DIR --node-id n1 \\
        --source online [--commit-seqs FILE.json] [--applied-index N] [--skip-messages]

writes OUT_DIR/<node_id>/ (export.py) and exits 0; on failure one line on stderr, exit 1.
`--commit-seqs` is a JSON object {stream name: commit seq}; `--applied-index` the node's applied
Raft index (the metadata view is replayed up to it rather than the journal's stored commit
index, which lags up to a second).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from raftlog.audit.export import SOURCE_OFFLINE, SOURCE_ONLINE, export_node
from raftlog.base.clock import SystemClock

nice_increment = 10  # the child's CPU priority below the node's (os.nice)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftlog.audit.export_child")
    parser.add_argument("--from", dest="source_dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--source", choices=(SOURCE_ONLINE, SOURCE_OFFLINE),
                        default=SOURCE_ONLINE)
    parser.add_argument("--commit-seqs", type=Path)
    parser.add_argument("--applied-index", type=int)
    parser.add_argument("--skip-messages", action="store_true")
    args = parser.parse_args(argv)
    os.nice(nice_increment)
    try:
        commit_seqs = (None if args.commit_seqs is None
                       else _commit_seqs(json.loads(args.commit_seqs.read_text())))
        export_node(args.source_dir, args.out, node_id=args.node_id, source=args.source,
                    clock=SystemClock(), commit_seqs=commit_seqs,
                    applied_index=args.applied_index, skip_messages=args.skip_messages)
    except Exception as err:
        print(f"export failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


def _commit_seqs(document: object) -> dict[str, int]:
    if not isinstance(document, dict) or not all(
            isinstance(name, str) and isinstance(seq, int) for name, seq in document.items()):
        raise ValueError("--commit-seqs must hold a JSON object {stream: seq}")
    return dict(document)


if __name__ == "__main__":
    raise SystemExit(main())
