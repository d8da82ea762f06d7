"""The NATS side of scripts/bench_objects.py: run by the nats-py venv's python against a running
3-node nats-server cluster (bench_objects.py starts and stops it). Imports nothing of raftlog.

    python bench_objects_nats.py --servers nats://127.0.0.1:P1,... --small-count 20 \
        --small-bytes 1048576 --large-bytes 67108864 --chunk-bytes 524288

Makes the object store (replicas 3, file storage), connects to the node that leads its stream
(as the raftlog side talks to the bucket's primary), then times sequential puts and gets of the
same objects the raftlog side stores (nats-py hashes each object on put and checks it on get)
and prints one JSON document on stdout.
"""

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time

import nats
from nats.js.api import ObjectMeta, ObjectMetaOptions, ObjectStoreConfig

BUCKET = "bench"
STREAM_READY_S = 60.0
perf = time.perf_counter


def phase(name, count, size, elapsed_s):
    return {"phase": name, "objects": count, "object_bytes": size,
            "elapsed_s": round(elapsed_s, 3),
            "mib_per_s": round(count * size / elapsed_s / 2**20, 1) if elapsed_s else 0.0}


async def leader_url(servers):
    """The URL of the node that leads the store's stream (created through the first node)."""
    nc = await nats.connect(servers=servers[:1])
    try:
        js = nc.jetstream()
        with contextlib.suppress(Exception):  # absent on a fresh cluster
            await js.delete_object_store(BUCKET)
        await js.create_object_store(BUCKET, config=ObjectStoreConfig(replicas=3))
        deadline = time.monotonic() + STREAM_READY_S
        while time.monotonic() < deadline:
            info = await js.stream_info(f"OBJ_{BUCKET}")
            cluster = info.cluster
            if cluster and cluster.leader and all(r.current for r in cluster.replicas or []):
                return servers[int(cluster.leader.lstrip("n")) - 1], cluster.leader
            await asyncio.sleep(0.1)
        raise RuntimeError("the store's stream got no leader with current replicas")
    finally:
        await nc.close()


async def run(args):
    servers = args.servers.split(",")
    url, leader = await leader_url(servers)
    nc = await nats.connect(servers=[url], max_reconnect_attempts=0)
    try:
        store = await nc.jetstream().object_store(BUCKET)
        options = ObjectMetaOptions(max_chunk_size=args.chunk_bytes)
        small = [os.urandom(args.small_bytes) for _ in range(args.small_count)]
        large = os.urandom(args.large_bytes)
        await store.put("warmup", small[0], meta=ObjectMeta(name="warmup", options=options))
        results = []
        for label, objects in ((f"{args.small_count}x{args.small_bytes >> 20}MiB", small),
                               (f"1x{args.large_bytes >> 20}MiB", [large])):
            started = perf()
            for n, data in enumerate(objects):
                await store.put(f"{label}-{n}", data,
                                meta=ObjectMeta(name=f"{label}-{n}", options=options))
            results.append(phase(f"put {label}", len(objects), len(objects[0]),
                                 perf() - started))
            started = perf()
            for n, data in enumerate(objects):
                got = await store.get(f"{label}-{n}")
                if got.data != data:
                    raise RuntimeError(f"get {label}-{n}: wrong content")
            results.append(phase(f"get {label}", len(objects), len(objects[0]),
                                 perf() - started))
            del objects
        return {"leader": leader, "client": url, "chunk_bytes": args.chunk_bytes,
                "phases": results}
    finally:
        await nc.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--small-count", type=int, default=20)
    parser.add_argument("--small-bytes", type=int, default=2**20)
    parser.add_argument("--large-bytes", type=int, default=64 * 2**20)
    parser.add_argument("--chunk-bytes", type=int, default=512 * 1024)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
