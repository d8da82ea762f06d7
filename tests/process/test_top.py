"""`raftlog top` end to end (issue 16 item 7): a 3-node cluster started with `--metrics`, a
small workload, and `raftlog top --once --json` run through the CLI's own entry point, found
once through the cluster directory's pid files (`--dir`) and once through `--metrics`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import free_port, wait_until
from raftlog.node.cli.localcluster import NodeSpec
from raftlog.node.cli.main import main
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, types_pb2

call_timeout_s = 10.0
settle_timeout_s = 15.0
STREAM = "watched"
CONSUMER = "reader"
published = 15
fetched = 4


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[LocalCluster, dict[int, int]]]:
    ports = {i: free_port() for i in (1, 2, 3)}

    def node_args(spec: NodeSpec) -> list[str]:
        return ["--metrics", f"127.0.0.1:{ports[spec.index]}"]

    root: Path = tmp_path_factory.mktemp("top") / "cluster"
    cluster = LocalCluster(root, nodes=3, node_args=node_args)
    try:
        yield cluster.start_all(), ports
    finally:
        cluster.stop_all()


def top_json(capsys: pytest.CaptureFixture[str], *where: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["top", *where, "--once", "--json", "--interval", "0.3"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def _workload(cluster: LocalCluster) -> str:
    """Creates the stream, publishes through node 1, fetches some; returns the primary's id."""
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name=STREAM, subjects=[f"{STREAM}.>"], replicas=3)), timeout=call_timeout_s)
    for k in range(published):
        cluster.streams(1).Publish(streams_pb2.PublishRequest(
            stream=STREAM, subject=f"{STREAM}.a", payload=b"%d" % k), timeout=call_timeout_s)
    cluster.consumers(1).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream=STREAM, config=consumers_pb2.ConsumerConfig(name=CONSUMER, ack_wait_ms=60_000)),
        timeout=call_timeout_s)
    reply = cluster.consumers(1).Fetch(consumers_pb2.FetchRequest(
        stream=STREAM, consumer=CONSUMER, batch=fetched, max_wait_ms=1_000),
        timeout=call_timeout_s)
    assert len(reply.messages) == fetched
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=STREAM),
                                            timeout=call_timeout_s)
    return str(route.primary)


def test_top_shows_nodes_roles_and_the_stream_then_a_killed_node_as_down(
        metered: tuple[LocalCluster, dict[int, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, ports = metered
    primary = _workload(cluster)
    leader = cluster.wait_for_leader(settle_timeout_s)

    seen: list[dict[str, Any]] = []

    def settled() -> bool:
        """The stream is committed on the primary and every replica has acknowledged it."""
        seen.append(top_json(capsys, "--dir", str(cluster.root)))
        row = {s["name"]: s for s in seen[-1]["streams"]}.get(STREAM)
        return (row is not None and row["commit_seq"] == published
                and len(row["replication_lag"]) == 2 and not any(row["replication_lag"].values()))

    wait_until(settled, settle_timeout_s, what="top shows the stream settled")
    document = seen[-1]
    nodes = {n["name"]: n for n in document["nodes"]}
    assert sorted(nodes) == ["n1", "n2", "n3"]
    assert all(n["up"] and n["term"] >= 1 and n["rss_bytes"] > 0 for n in nodes.values())
    assert [name for name, n in nodes.items() if n["role"] == "leader"] == [leader]
    assert all(n["calls_per_s"] is not None for n in nodes.values())
    [row] = [s for s in document["streams"] if s["name"] == STREAM]
    assert (row["primary"], row["last_seq"]) == (primary, published)
    assert sorted(row["replication_lag"]) == sorted({"n1", "n2", "n3"} - {primary})
    assert row["consumers"] == {CONSUMER: {"pending": published - fetched,
                                           "ack_pending": fetched}}

    victim = next(i for i in (1, 2, 3) if f"n{i}" not in (primary, leader))
    cluster.kill9(victim)
    addresses = ",".join(f"127.0.0.1:{ports[i]}" for i in (1, 2, 3))
    after = top_json(capsys, "--metrics", addresses)
    state = {n["address"]: n["up"] for n in after["nodes"]}
    assert state == {f"127.0.0.1:{ports[i]}": i != victim for i in (1, 2, 3)}
    [row] = [s for s in after["streams"] if s["name"] == STREAM]
    assert row["primary"] == f"127.0.0.1:{ports[cluster.index_of(primary)]}"


def test_top_text_once_and_bad_usage(metered: tuple[LocalCluster, dict[int, int]],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cluster, ports = metered
    alive = min(cluster.running)
    capsys.readouterr()
    assert main(["top", "--metrics", f"127.0.0.1:{ports[alive]}", "--once",
                 "--interval", "0.2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NODE") and f"127.0.0.1:{ports[alive]}  up" in out
    assert STREAM in out  # present on every node: each holds a replica
    assert main(["top", "--dir", str(cluster.root / "missing"), "--once"]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["top", "--once"]) == 2  # neither --dir nor --metrics
