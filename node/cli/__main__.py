"""`python -m raftlog.node.cli`: the `raftlog` command. A node chooses its gRPC stack here,
before anything imports grpc (grpc_stack.py): it costs a new interpreter, not the imports."""

import sys

from raftlog.node.cli import grpc_stack

if sys.argv[1:2] == [grpc_stack.NODE_COMMAND]:
    grpc_stack.reexec_node(sys.argv[1:])

from raftlog.node.cli.main import main

raise SystemExit(main())
