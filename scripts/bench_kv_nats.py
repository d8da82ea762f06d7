"""The NATS KV side of scripts/bench_kv.py: run by the nats-py venv's python against a running
3-node nats-server cluster (bench_kv.py starts and stops it). Imports nothing of raftlog.

    python bench_kv_nats.py --servers nats://127.0.0.1:P1,... --puts 2000 --gets 2000

Makes the bucket (replicas 3, history 1, file storage), connects to the node that leads its
stream (as the raftlog side talks to the bucket's primary), then times sequential puts and
gets, one call at a time, and prints one JSON document on stdout.
"""

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time

import nats
from nats.js.api import KeyValueConfig

BUCKET = "bench"
STREAM_READY_S = 60.0
perf = time.perf_counter


def summary(name, latencies_s, elapsed_s):
    ordered = sorted(latencies_s)
    return {
        "phase": name, "ops": len(ordered), "elapsed_s": round(elapsed_s, 3),
        "ops_per_s": round(len(ordered) / elapsed_s, 1) if elapsed_s else 0.0,
        "p50_ms": round(1000 * statistics.median(ordered), 3) if ordered else None,
        "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 3) if ordered else None,
    }


async def leader_url(servers):
    """The URL of the node that leads the bucket's stream (created through the first node)."""
    nc = await nats.connect(servers=servers[:1])
    try:
        js = nc.jetstream()
        with contextlib.suppress(Exception):  # absent on a fresh cluster
            await js.delete_key_value(BUCKET)
        await js.create_key_value(KeyValueConfig(bucket=BUCKET, history=1, replicas=3))
        deadline = time.monotonic() + STREAM_READY_S
        while time.monotonic() < deadline:
            info = await js.stream_info(f"KV_{BUCKET}")
            cluster = info.cluster
            if cluster and cluster.leader and all(r.current for r in cluster.replicas or []):
                return servers[int(cluster.leader.lstrip("n")) - 1], cluster.leader
            await asyncio.sleep(0.1)
        raise RuntimeError("the bucket's stream got no leader with current replicas")
    finally:
        await nc.close()


async def run(args):
    servers = args.servers.split(",")
    url, leader = await leader_url(servers)
    nc = await nats.connect(servers=[url])
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        value = b"v" * args.value_bytes
        keys = [f"k{n}" for n in range(args.keys)]
        for n in range(args.warmup):
            await kv.put(keys[n % len(keys)], value)
        results = []
        for name, count in (("put", args.puts), ("get", args.gets)):
            latencies = []
            started = perf()
            for n in range(count):
                at = perf()
                if name == "put":
                    await kv.put(keys[n % len(keys)], value)
                else:
                    entry = await kv.get(keys[n % len(keys)])
                    if entry.value != value:
                        raise RuntimeError(f"get {keys[n % len(keys)]}: wrong value")
                latencies.append(perf() - at)
            results.append(summary(name, latencies, perf() - started))
        return {"leader": leader, "client": url, "phases": results}
    finally:
        await nc.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--puts", type=int, default=2000)
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--value-bytes", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
