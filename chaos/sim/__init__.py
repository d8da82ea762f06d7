"""raftlog.chaos.sim: a seeded, deterministic, in-process simulation of a raftlog cluster, beside
the process harness (chaos/cluster.py). N nodes, their replication links and the Raft metadata
run on one virtual-time event loop with a simulated network and disks; a seed decides every
delay, fault and client choice, so a failing seed replays exactly
(`python -m raftlog.chaos.sim --seed S --schedules 1 ...`).

- `loop`     the virtual-time event loop, and which node incarnation owns each task.
- `clock`    the nodes' clocks (jumps, skew) and the liveness loop heartbeat on virtual time.
- `network`  links: latency, loss, partitions, resets, crashed peers; unary and stream calls.
- `raft`     the metadata group, modelled; per-node views applied by the real state machine.
- `store`    a node's store and the disk that keeps only what was made durable.
- `node`     one node: the real components of node/server.py wired over the above.
- `faults`   seeded fault schedules.
- `workload` publishers (msg_ids, retries, hedging) and readers, and their history.
- `checks`   the verdict: safety (G1-G4, G6, G7) and convergence after the heal.
- `bugs`     bugs to inject on purpose, to show they are found.
- `run`      one run of a seed; `__main__` the command line.
- `trace`    the digest that shows two runs of a seed did the same.

Imports raftlog.node, raftlog.raft, raftlog.base and the protos; no product code imports it.
"""
