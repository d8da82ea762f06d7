"""`python -m raftlog.node.cli`: the `raftlog` command."""

from raftlog.node.cli.main import main

raise SystemExit(main())
