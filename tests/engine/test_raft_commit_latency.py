"""A command commits in about a round trip, not at the append-entries timer
(raft/syncobj_glue.py: the tick thread is woken by a command and sends new entries at once when
the followers it needs have nothing in flight).

Three in-process members with a slow timer (0.5 s between timed appends): without the early
send a command waits for that timer, 0.25 s on average; with it, far less. Then many concurrent
commands still commit, gathered into fewer appends than commands."""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from pathlib import Path

from raftlog.node.engine.storage import CF_RAFT_LOG, CF_RAFT_META, Storage
from raftlog.raft import commands as c
from raftlog.raft.api import ensure_ok
from raftlog.raft.group import RaftGroup, RaftTimings

SLOW_TIMER = RaftTimings(append_entries_period_s=0.5, election_timeout_min_s=1.6,
                         election_timeout_max_s=2.0, leader_fallback_timeout_s=2.0,
                         connection_timeout_s=2.0)
leader_timeout_s = 20.0
propose_timeout_s = 10.0
commit_s_max = 0.15  # well under the timer's average wait (0.25 s), far over a round trip


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_command_commits_without_waiting_for_the_append_timer(tmp_path: Path) -> None:
    async def main() -> None:
        addresses = [f"127.0.0.1:{_port()}" for _ in range(3)]
        storages = [Storage(tmp_path / f"n{i}") for i in range(3)]
        groups = [RaftGroup(self_address=address,
                            peers=[a for a in addresses if a != address],
                            journal_db=storage.db, journal_cfs=(CF_RAFT_LOG, CF_RAFT_META),
                            snapshot_path=tmp_path / f"n{i}" / "snapshot.pb",
                            timings=SLOW_TIMER)
                  for i, (address, storage) in enumerate(zip(addresses, storages, strict=True))]
        try:
            deadline = time.monotonic() + leader_timeout_s
            while not any(group.is_leader() for group in groups):
                assert time.monotonic() < deadline, "no leader"
                await asyncio.sleep(0.05)
            leader = next(group for group in groups if group.is_leader())
            ensure_ok(await leader.propose(c.barrier(), timeout_s=propose_timeout_s))
            took = []
            for _ in range(15):
                started = time.monotonic()
                ensure_ok(await leader.propose(c.barrier(), timeout_s=propose_timeout_s))
                took.append(time.monotonic() - started)
            assert statistics.median(took) < commit_s_max, took
            early = leader.status().journal["early_appends"]
            assert early >= 15
            # Concurrent commands: all commit, and appends carry several of them.
            results = await asyncio.gather(*(
                leader.propose(c.barrier(), timeout_s=propose_timeout_s) for _ in range(200)))
            assert all(result.ok for result in results)
            assert leader.status().journal["early_appends"] - early < 200
        finally:
            for group in groups:
                group.close()
            for storage in storages:
                storage.close()

    asyncio.run(main())
