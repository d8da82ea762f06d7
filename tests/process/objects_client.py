"""A client process for tests/process/test_objects_large.py: streams an object of SIZE bytes
into a bucket (PutStream) and back out (GetStream) with content generated and hashed on the
fly, then prints one JSON line: the hashes, the timings and this process's peak RSS (VmHWM)
before and after, so the test can tell that memory stayed bounded by the chunk size.

    python tests/process/objects_client.py ADDRESS BUCKET NAME SIZE
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections.abc import Iterator

import grpc

from raftlog.base import limits
from raftlog.v1 import objects_pb2, objects_pb2_grpc

FRAME_BYTES = limits.object_chunk_bytes_default
CALL_TIMEOUT_S = 600.0


def peak_rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def frames(bucket: str, name: str, size: int, hasher: hashlib._Hash
           ) -> Iterator[objects_pb2.PutObjectFrame]:
    rng = random.Random(name)
    yield objects_pb2.PutObjectFrame(start=objects_pb2.PutObjectStart(bucket=bucket, name=name))
    sent = 0
    while sent < size:
        data = rng.randbytes(min(FRAME_BYTES, size - sent))
        hasher.update(data)
        sent += len(data)
        yield objects_pb2.PutObjectFrame(data=data)
    yield objects_pb2.PutObjectFrame(finish=objects_pb2.PutObjectFinish(
        sha256=hasher.hexdigest()))


def main(address: str, bucket: str, name: str, size: int) -> None:
    channel = grpc.insecure_channel(address)
    stub = objects_pb2_grpc.ObjectsStub(channel)
    rss_start = peak_rss_kib()
    put_hash = hashlib.sha256()
    started = time.monotonic()
    info = stub.PutStream(frames(bucket, name, size, put_hash), timeout=CALL_TIMEOUT_S)
    put_s = time.monotonic() - started
    get_hash = hashlib.sha256()
    received = 0
    largest_frame = 0
    started = time.monotonic()
    for frame in stub.GetStream(objects_pb2.GetObjectRequest(bucket=bucket, name=name),
                                timeout=CALL_TIMEOUT_S):
        get_hash.update(frame.data)
        received += len(frame.data)
        largest_frame = max(largest_frame, len(frame.data))
    get_s = time.monotonic() - started
    print(json.dumps({
        "size": info.size, "stored_sha256": info.sha256, "sent_sha256": put_hash.hexdigest(),
        "received_sha256": get_hash.hexdigest(), "received": received,
        "largest_frame": largest_frame, "put_s": put_s, "get_s": get_s,
        "rss_start_kib": rss_start, "rss_peak_kib": peak_rss_kib()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
