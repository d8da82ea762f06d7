"""One metadata-group member in its own process, for tests/process/test_raft_group.py.

    python tests/raft_node_main.py --self HOST:PORT [--peers A,B] --data DIR [--secret S]

Builds a RaftGroup in the main thread (its tick thread lives as long as that thread), then runs
an event loop in the same thread that answers JSON lines on stdin, one JSON line each on stdout:
    {"id": 1, "op": "status"}                  -> status, journal counters, leader events
    {"id": 2, "op": "propose", "command": B64, "timeout_s": 2}   -> {"result": B64}
    {"id": 3, "op": "snapshot"}                -> {"snapshot": B64} (the state as protobuf)
    {"id": 4, "op": "add_member" | "remove_member", "address": A, "timeout_s": 5}
    {"id": 5, "op": "bench", "count": N, "in_flight": W}   -> latencies and rate of barriers
    {"id": 6, "op": "exit"}
Errors come back as {"id": n, "error": {"reason": ..., "message": ..., "metadata": {...}}}.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict

from raftlog.base.errors import RaftlogError
from raftlog.internal import raft_pb2
from raftlog.raft import commands
from raftlog.raft.api import LeaderChange
from raftlog.raft.group import RaftGroup
from raftlog.raft.state_snapshot import to_snapshot

JOURNAL_CFS = ("raft_log", "raft_meta")


def open_db(path: Path) -> Rdict:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return Rdict(str(path), options,
                 column_families={name: Options(raw_mode=True) for name in JOURNAL_CFS})


class Node:
    def __init__(self, group: RaftGroup) -> None:
        self.group = group
        self.leader_events: list[dict[str, Any]] = []

    def on_leader_change(self, event: LeaderChange) -> None:
        self.leader_events.append({"is_leader": event.is_leader, "leader": event.leader,
                                   "term": event.term, "monotonic_s": time.monotonic()})

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "status":
            return self.status()
        if op == "propose":
            command = raft_pb2.RaftCommand.FromString(base64.b64decode(request["command"]))
            result = await self.group.propose(command, timeout_s=request.get("timeout_s", 2.0))
            return {"result": base64.b64encode(result.SerializeToString()).decode()}
        if op == "snapshot":
            with self.group.read_state() as state:
                snapshot = to_snapshot(state)
            return {"snapshot": base64.b64encode(snapshot.SerializeToString()).decode()}
        if op in ("add_member", "remove_member"):
            change = getattr(self.group, op)
            await change(request["address"], timeout_s=request.get("timeout_s", 5.0))
            return {}
        if op == "bench":
            return await self.bench(count=request["count"], in_flight=request["in_flight"])
        raise ValueError(f"unknown op {op!r}")

    def status(self) -> dict[str, Any]:
        status = self.group.status()
        journal = self.group.journal
        return {
            "term": status.term, "is_leader": status.is_leader, "leader": status.leader,
            "commit_index": status.commit_index, "applied_index": status.applied_index,
            "ready": status.ready, "has_quorum": status.has_quorum,
            "peers": [{"address": peer.address, "connected": peer.connected}
                      for peer in status.peers],
            "counters": dict(status.journal), "failure": status.failure,
            "persisted_term": journal.getCurrentTerm(),
            "persisted_vote": journal.getVotedForNodeId(),
            "leader_events": self.leader_events, "pid": os.getpid(),
        }

    async def bench(self, *, count: int, in_flight: int) -> dict[str, Any]:
        """`count` barriers proposed by `in_flight` concurrent callers; latencies in ms."""
        latencies: list[float] = []
        remaining = [count]

        async def caller() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                started = time.perf_counter()
                await self.group.propose(commands.barrier(), timeout_s=30.0)
                latencies.append((time.perf_counter() - started) * 1000)

        syncs_before = self.group.journal.counters["syncs"]
        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
        return {"latencies_ms": latencies, "elapsed_s": elapsed,
                "syncs": self.group.journal.counters["syncs"] - syncs_before}


def reply(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


async def serve(node: Node) -> None:
    loop = asyncio.get_running_loop()
    node.group.attach_loop(loop)
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read_stdin, daemon=True).start()
    reply({"event": "started", "pid": os.getpid()})
    tasks: set[asyncio.Task[None]] = set()
    while (line := await lines.get()) is not None:
        request = json.loads(line)
        if request["op"] == "exit":
            break
        task = asyncio.create_task(answer(node, request))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def answer(node: Node, request: dict[str, Any]) -> None:
    try:
        payload = await node.handle(request)
    except RaftlogError as err:
        payload = {"error": {"reason": err.reason.name, "message": err.message,
                             "metadata": err.metadata}}
    except Exception as err:
        payload = {"error": {"reason": "EXCEPTION", "message": repr(err), "metadata": {}}}
    reply({"id": request["id"], **payload})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--self", dest="self_address", required=True)
    parser.add_argument("--peers", default="")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--secret", default="")
    parser.add_argument("--switch-interval-s", type=float, default=0.001)
    args = parser.parse_args()
    # A thread back from an fsync or a poll waits up to this long for the GIL while another
    # thread computes (DEPENDENCIES.md §5.2); the default 5 ms throttles the tick thread.
    sys.setswitchinterval(args.switch_interval_s)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.data.mkdir(parents=True, exist_ok=True)
    db = open_db(args.data / "db")
    loop = asyncio.new_event_loop()
    node: Node | None = None
    group = RaftGroup(
        self_address=args.self_address,
        peers=[peer for peer in args.peers.split(",") if peer],
        journal_db=db, journal_cfs=JOURNAL_CFS, snapshot_path=args.data / "raft.snapshot",
        secret=args.secret, loop=loop,
        on_leader_change=lambda event: node.on_leader_change(event) if node else None,
    )
    node = Node(group)
    try:
        loop.run_until_complete(serve(node))
    finally:
        group.close()
        loop.close()
        db.close()


if __name__ == "__main__":
    main()
