"""Where a unary publish's time goes (issue 17, item 3): the p50 of calls that each add one step
to the one before, all to the node that leads the bench stream, one caller, one call at a time:

    health check            the floor: a gRPC round trip of Python's grpc.aio, client and node
    stream info             plus the node's service layers (auth, limits, metrics, ops), no write
    publish, R1             plus a write made durable here (group commit, fsync)
    publish, R<n>           plus the replication round trip to a majority (the unary phase)

The differences between successive rows are the steps' costs, printed with them.
"""

from __future__ import annotations

import time
from typing import Any

from grpc_health.v1 import health_pb2

from raftlog.node.cli.client import Client
from raftlog.node.cli.loadgen import percentile
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, streams_pb2, types_pb2

r1_names_max = 500  # names tried for an R1 stream led by the bench stream's primary


async def _p50_ms(call: Any, count: int) -> float:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        latencies.append((time.perf_counter() - started) * 1000)
    return round(percentile(latencies, 0.5), 3)


async def _r1_stream_on(client: Client, address: str) -> str:
    """Creates an R1 stream that `address` leads (the first name the ring places there)."""
    stub: Any = cluster_pb2_grpc.ClusterStub(client.channel)  # type: ignore[no-untyped-call]
    for k in range(r1_names_max):
        name = f"bench-r1-{k}"
        route = await stub.ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=name),
                                        timeout=client.deadline_s())
        if route.primary_grpc_address == address:
            await client.streams.CreateStream(streams_pb2.CreateStreamRequest(
                config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"], replicas=1)),
                timeout=client.deadline_s())
            return name
    raise RuntimeError(f"no R1 stream name placed on {address} in {r1_names_max} tries")


async def unary_breakdown(address: str, *, stream: str, replicas: int, replicated_p50_ms: float,
                          calls: int, payload: bytes) -> dict[str, Any]:
    async with Client(address, timeout_s=30.0) as client:
        r1 = stream if replicas == 1 else await _r1_stream_on(client, address)
        publish = streams_pb2.PublishRequest(stream=r1, subject=f"{r1}.x" if r1 != stream
                                             else "bench.data", payload=payload)
        await client.streams.Publish(publish, timeout=client.deadline_s())  # its lease, warm
        steps = {
            "health_p50_ms": await _p50_ms(lambda: client.health.Check(
                health_pb2.HealthCheckRequest(), timeout=client.deadline_s()), calls),
            "stream_info_p50_ms": await _p50_ms(lambda: client.streams.GetStreamInfo(
                streams_pb2.GetStreamInfoRequest(name=stream), timeout=client.deadline_s()),
                calls),
            "publish_r1_p50_ms": await _p50_ms(lambda: client.streams.Publish(
                publish, timeout=client.deadline_s()), calls),
        }
    if replicas > 1:
        steps[f"publish_r{replicas}_p50_ms"] = replicated_p50_ms
    values = list(steps.values())
    costs = {"service_layers_ms": values[1] - values[0], "durable_write_ms": values[2] - values[1]}
    if replicas > 1:
        costs["replication_ms"] = values[3] - values[2]
    return {**steps, **{k: round(v, 3) for k, v in costs.items()}, "calls": calls}


def table_line(figures: dict[str, Any]) -> str:
    steps = [f"{k.removesuffix('_p50_ms').replace('_', ' ')} {v:.2f}" for k, v in figures.items()
             if k.endswith("_p50_ms")]
    return "unary p50 breakdown (ms): " + ", ".join(steps)
