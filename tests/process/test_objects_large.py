"""A 200 MiB object through the streaming RPCs on a 3-node cluster, with memory bounded on both
sides: the client (a separate process, tests/process/objects_client.py) and every node must grow
their peak RSS (VmHWM) by well under the object's size. The put goes through a node that is not
the bucket's primary, so every chunk is also forwarded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import cluster_pb2, objects_pb2, objects_pb2_grpc

MiB = 1024 * 1024
OBJECT_BYTES = 200 * MiB
WARM_BYTES = 150 * MiB
RSS_GROWTH_BYTES_MAX = OBJECT_BYTES // 4  # "well under the object's size"
transfer_timeout_s = 600.0
call_timeout_s = 30.0
BUCKET = "large"
CLIENT = Path(__file__).with_name("objects_client.py")


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def transfer(cluster: LocalCluster, front: int, name: str, size: int) -> dict[str, Any]:
    """Puts and gets an object through node `front` from a client process; its report."""
    completed = subprocess.run(
        [sys.executable, str(CLIENT), cluster.address(front), BUCKET, name, str(size)],
        capture_output=True, text=True, timeout=transfer_timeout_s, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["size"] == report["received"] == size
    return report


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def test_a_200_mib_object_streams_with_bounded_memory(cluster: LocalCluster) -> None:
    stub = objects_pb2_grpc.ObjectsStub(cluster.channel(1))

    def created() -> bool:
        try:
            stub.CreateBucket(objects_pb2.CreateBucketRequest(
                config=objects_pb2.BucketConfig(name=BUCKET)), timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(created, 20, interval_s=0.1, what="bucket created")
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(
        stream=f"OBJ_{BUCKET}"), timeout=call_timeout_s)
    front = next(i for i in (1, 2, 3) if cluster.spec(i).node_id != route.primary)
    pids = {i: cluster.node(i).pid for i in (1, 2, 3)}
    transfer(cluster, front, "warm", WARM_BYTES)
    before = {i: peak_rss_bytes(pid) for i, pid in pids.items()}
    report = transfer(cluster, front, "big", OBJECT_BYTES)
    growth = {f"n{i}": peak_rss_bytes(pid) - before[i] for i, pid in pids.items()}
    client_growth = (report["rss_peak_kib"] - report["rss_start_kib"]) * 1024
    print(f"\n200 MiB object through n{front} (primary {route.primary}): put "
          f"{OBJECT_BYTES / MiB / report['put_s']:.1f} MiB/s, get "
          f"{OBJECT_BYTES / MiB / report['get_s']:.1f} MiB/s; peak RSS growth (MiB): client "
          f"{client_growth / MiB:.1f}, " + ", ".join(
              f"{node} {value / MiB:.1f}" for node, value in growth.items()))
    assert report["stored_sha256"] == report["sent_sha256"] == report["received_sha256"]
    assert report["largest_frame"] <= 1024 * 1024
    assert client_growth < RSS_GROWTH_BYTES_MAX, client_growth
    for node, value in growth.items():
        assert value < RSS_GROWTH_BYTES_MAX, (node, value)
