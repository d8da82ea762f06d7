"""raftlog.node.ops: the protocol-neutral operations layer. Every front-end (the raftlog.v1
services, and the compatible protocols beside them) calls it with canonical requests; it decides
whether the call is served here or forwarded, and applies the Raft-first metadata rules.
Imports `cluster`, `consumers`, `engine`, `transport`, `raftlog.raft`, `raftlog.base`, protos.
"""
