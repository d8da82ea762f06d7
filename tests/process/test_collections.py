"""Collections (raftlog.v1 Collections: hashes, sets, queues) end to end on one module-scoped
3-node cluster: every call through gRPC, each call of a sequence sent to a different node (so
most are forwarded to the collection stream's primary), bad input, the size limits, two pops
racing through two nodes, the CLI, and last a kill -9 of a collection's primary with its contents
read back after the failover.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.ops import collection_layout as layout
from raftlog.node.transport.rpc import from_rpc_error, grpc_status
from raftlog.v1 import cluster_pb2, collections_pb2_grpc, consumers_pb2, streams_pb2, types_pb2
from raftlog.v1 import collections_pb2 as pb
from tests.process.cluster_helpers import route

HASH, SET, QUEUE = pb.COLLECTION_KIND_HASH, pb.COLLECTION_KIND_SET, pb.COLLECTION_KIND_QUEUE
RPC_TIMEOUT_S = 15.0
FAILOVER_BOUND_S = 30.0
CLI_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("collections") / "cluster", nodes=3)
    try:
        yield local.start_all()
    finally:
        local.stop_all()


def stub(cluster: LocalCluster, i: int) -> Any:
    return collections_pb2_grpc.CollectionsStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def call(cluster: LocalCluster, i: int, method: str, **fields: Any) -> Any:
    request_type = getattr(pb, _REQUESTS[method])
    return getattr(stub(cluster, i), method)(request_type(**fields), timeout=RPC_TIMEOUT_S)


_REQUESTS = {
    "CreateCollection": "CreateCollectionRequest", "DeleteCollection": "DeleteCollectionRequest",
    "GetCollectionInfo": "GetCollectionInfoRequest",
    "ListCollections": "ListCollectionsRequest", "SetHashField": "SetHashFieldRequest",
    "GetHashField": "HashFieldRequest", "HashFieldExists": "HashFieldRequest",
    "DeleteHashField": "HashFieldRequest", "GetHash": "HashKeyRequest",
    "ListHashFields": "HashKeyRequest", "CountHashFields": "HashKeyRequest",
    "AddSetMember": "SetMemberRequest", "RemoveSetMember": "SetMemberRequest",
    "IsSetMember": "SetMemberRequest", "ListSetMembers": "SetKeyRequest",
    "CountSetMembers": "SetKeyRequest", "PushQueue": "PushQueueRequest",
    "PopQueue": "PopQueueRequest", "PeekQueue": "PeekQueueRequest",
    "CountQueue": "CountQueueRequest",
}


def expect_error(cluster: LocalCluster, i: int, method: str, reason: Reason,
                 **fields: Any) -> dict[str, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(cluster, i, method, **fields)
    assert info.value.code() == grpc_status(reason), info.value.details()
    err = from_rpc_error(info.value)
    assert err is not None and err.reason is reason, (info.value.details(), err)
    return dict(err.metadata)


def create(cluster: LocalCluster, kind: int, name: str, **fields: Any) -> pb.CollectionInfo:
    """Creates through node 1, retrying while the fresh cluster still answers UNAVAILABLE."""
    created: list[pb.CollectionInfo] = []

    def attempt() -> bool:
        try:
            created.append(call(cluster, 1, "CreateCollection", kind=kind, name=name, **fields))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(attempt, 20, interval_s=0.1, what=f"collection {name} created")
    return created[0]


# ------------------------------------------------------------------------------------- hash


def test_hash_fields_set_read_and_deleted_through_every_node(cluster: LocalCluster) -> None:
    create(cluster, HASH, "users")
    first = call(cluster, 2, "SetHashField", collection="users", key="u:1", field="name",
                 value=b"ada").revision
    for i, (field, value) in enumerate([("mail", b"ada@x"), ("a.b *>", b"\x00\xff"),
                                        ("é🙂", b"")]):
        call(cluster, 1 + i % 3, "SetHashField", collection="users", key="u:1", field=field,
             value=value)
    again = call(cluster, 3, "SetHashField", collection="users", key="u:1", field="name",
                 value=b"ada l.").revision
    assert again > first
    entry = call(cluster, 1, "GetHashField", collection="users", key="u:1", field="name")
    assert (entry.field, entry.value, entry.revision) == ("name", b"ada l.", again)
    assert call(cluster, 2, "HashFieldExists", collection="users", key="u:1",
                field="a.b *>").exists
    assert not call(cluster, 3, "HashFieldExists", collection="users", key="u:1",
                    field="nope").exists
    assert not call(cluster, 3, "HashFieldExists", collection="users", key="u:2",
                    field="name").exists
    everything = call(cluster, 3, "GetHash", collection="users", key="u:1")
    assert {e.field: e.value for e in everything.entries} == {
        "name": b"ada l.", "mail": b"ada@x", "a.b *>": b"\x00\xff", "é🙂": b""}
    assert not everything.truncated
    fields = call(cluster, 1, "ListHashFields", collection="users", key="u:1")
    assert sorted(fields.fields) == sorted(["name", "mail", "a.b *>", "é🙂"])
    page = call(cluster, 1, "ListHashFields", collection="users", key="u:1", limit=2)
    assert len(page.fields) == 2 and page.truncated
    assert call(cluster, 2, "CountHashFields", collection="users", key="u:1").count == 4
    assert call(cluster, 2, "CountHashFields", collection="users", key="u:2").count == 0

    assert call(cluster, 3, "DeleteHashField", collection="users", key="u:1",
                field="mail").deleted
    assert not call(cluster, 1, "DeleteHashField", collection="users", key="u:1",
                    field="mail").deleted
    metadata = expect_error(cluster, 2, "GetHashField", Reason.FIELD_NOT_FOUND,
                            collection="users", key="u:1", field="mail")
    assert metadata["field"] == "mail"
    assert call(cluster, 1, "CountHashFields", collection="users", key="u:1").count == 3
    reborn = call(cluster, 1, "SetHashField", collection="users", key="u:1", field="mail",
                  value=b"new").revision
    assert reborn > again
    assert call(cluster, 2, "GetHashField", collection="users", key="u:1",
                field="mail").value == b"new"
    # The delete purged the old value and its marker: the stream holds the live fields only.
    info = call(cluster, 3, "GetCollectionInfo", kind=HASH, name="users")
    assert info.messages == 4


# -------------------------------------------------------------------------------------- set


def test_set_members_added_checked_listed_and_removed(cluster: LocalCluster) -> None:
    create(cluster, SET, "tags")
    assert call(cluster, 1, "AddSetMember", collection="tags", key="post", member="red").added
    assert not call(cluster, 2, "AddSetMember", collection="tags", key="post",
                    member="red").added
    for i, member in enumerate(["blue", "green", "a.b"]):
        assert call(cluster, 1 + i % 3, "AddSetMember", collection="tags", key="post",
                    member=member).added
    assert call(cluster, 3, "IsSetMember", collection="tags", key="post", member="blue").is_member
    assert not call(cluster, 3, "IsSetMember", collection="tags", key="post",
                    member="pink").is_member
    assert sorted(call(cluster, 1, "ListSetMembers", collection="tags",
                       key="post").members) == ["a.b", "blue", "green", "red"]
    assert call(cluster, 2, "CountSetMembers", collection="tags", key="post").count == 4
    assert call(cluster, 2, "RemoveSetMember", collection="tags", key="post",
                member="blue").removed
    assert not call(cluster, 3, "RemoveSetMember", collection="tags", key="post",
                    member="blue").removed
    assert not call(cluster, 1, "IsSetMember", collection="tags", key="post",
                    member="blue").is_member
    assert call(cluster, 1, "CountSetMembers", collection="tags", key="post").count == 3
    assert call(cluster, 3, "AddSetMember", collection="tags", key="post", member="blue").added
    assert call(cluster, 1, "CountSetMembers", collection="tags", key="other").count == 0


def test_racing_adds_and_removes_through_two_nodes_each_change_once(
        cluster: LocalCluster) -> None:
    """Two clients add, then remove, the same members at once, each through its own node: for
    every member exactly one add answers added and exactly one remove answers removed."""
    create(cluster, SET, "racing")
    members = [f"m{k}" for k in range(12)]
    answers: dict[str, list[tuple[int, bool]]] = {"AddSetMember": [], "RemoveSetMember": []}

    def run(i: int, method: str, flag: str) -> None:
        for member in members:
            reply = call(cluster, i, method, collection="racing", key="k", member=member)
            answers[method].append((i, getattr(reply, flag)))

    for method, flag in (("AddSetMember", "added"), ("RemoveSetMember", "removed")):
        threads = [threading.Thread(target=run, args=(i, method, flag)) for i in (2, 3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=RPC_TIMEOUT_S * 4)
        assert len(answers[method]) == 2 * len(members)
        assert sum(flag for _, flag in answers[method]) == len(members), answers[method]
    assert call(cluster, 1, "CountSetMembers", collection="racing", key="k").count == 0
    assert call(cluster, 1, "GetCollectionInfo", kind=SET, name="racing").messages == 0


def test_a_delete_cut_short_hides_the_value_and_the_next_delete_clears_it(
        cluster: LocalCluster) -> None:
    """What a delete leaves when its node dies between its steps, made by hand: a delete mark
    beside a live value (died before the tombstone) keeps the field; a mark beside a tombstone
    (died before the purges) hides it from every read; the next delete clears both."""
    create(cluster, HASH, "cut")
    for field in ("kept", "gone", "other"):
        call(cluster, 1, "SetHashField", collection="cut", key="k", field=field, value=b"v")
    streams = cluster.streams(2)

    def publish(field: str, role: str, **fields: Any) -> None:
        prefix = layout.item_prefix(HASH, "k", field, what="field")
        streams.Publish(streams_pb2.PublishRequest(stream="HASH_cut", subject=prefix + role,
                                                   **fields), timeout=RPC_TIMEOUT_S)

    publish("kept", layout.MARK_TOKEN)
    publish("gone", layout.MARK_TOKEN)
    publish("gone", layout.VALUE_TOKEN, headers=[layout.TOMBSTONE])
    assert call(cluster, 3, "HashFieldExists", collection="cut", key="k", field="kept").exists
    assert not call(cluster, 3, "HashFieldExists", collection="cut", key="k",
                    field="gone").exists
    expect_error(cluster, 1, "GetHashField", Reason.FIELD_NOT_FOUND, collection="cut", key="k",
                 field="gone")
    assert call(cluster, 2, "CountHashFields", collection="cut", key="k").count == 2
    assert sorted(call(cluster, 3, "ListHashFields", collection="cut", key="k").fields) == [
        "kept", "other"]
    assert {e.field for e in call(cluster, 1, "GetHash", collection="cut",
                                   key="k").entries} == {"kept", "other"}
    assert call(cluster, 2, "GetCollectionInfo", kind=HASH, name="cut").messages == 5
    assert not call(cluster, 2, "DeleteHashField", collection="cut", key="k",
                    field="gone").deleted
    assert call(cluster, 3, "DeleteHashField", collection="cut", key="k", field="kept").deleted
    assert call(cluster, 1, "GetCollectionInfo", kind=HASH, name="cut").messages == 1
    assert call(cluster, 1, "ListHashFields", collection="cut", key="k").fields == ["other"]


# ------------------------------------------------------------------------------------ queue


def test_queue_pushes_pops_in_order_peeks_and_counts(cluster: LocalCluster) -> None:
    create(cluster, QUEUE, "jobs")
    sequences = [call(cluster, 1 + k % 3, "PushQueue", collection="jobs",
                      value=b"job-%d" % k).sequence for k in range(5)]
    assert sequences == sorted(sequences) and len(set(sequences)) == 5
    assert call(cluster, 2, "CountQueue", collection="jobs").count == 5
    peeked = call(cluster, 3, "PeekQueue", collection="jobs")
    assert [i.value for i in peeked.items] == [b"job-%d" % k for k in range(5)]
    later = call(cluster, 3, "PeekQueue", collection="jobs", from_sequence=sequences[3])
    assert [i.sequence for i in later.items] == sequences[3:]
    first = call(cluster, 1, "PopQueue", collection="jobs")
    assert (first.sequence, first.value) == (sequences[0], b"job-0")
    assert call(cluster, 2, "PopQueue", collection="jobs").value == b"job-1"
    assert call(cluster, 3, "CountQueue", collection="jobs").count == 3
    assert [i.value for i in call(cluster, 1, "PeekQueue", collection="jobs").items] == [
        b"job-2", b"job-3", b"job-4"]
    assert [call(cluster, 2, "PopQueue", collection="jobs").value for _ in range(3)] == [
        b"job-2", b"job-3", b"job-4"]
    expect_error(cluster, 3, "PopQueue", Reason.QUEUE_EMPTY, collection="jobs")
    expect_error(cluster, 1, "PopQueue", Reason.QUEUE_EMPTY, collection="jobs", max_wait_ms=200)
    assert call(cluster, 1, "CountQueue", collection="jobs").count == 0


def test_a_value_handed_to_a_pop_that_died_comes_back_after_the_ack_wait(
        cluster: LocalCluster) -> None:
    """A pop that fetched and never acked (its node died) is what a bare Fetch of the queue's
    consumer leaves: the value waits out queue_pop_ack_wait_ms, then another pop gets it."""
    create(cluster, QUEUE, "orphan")
    for value in (b"a", b"b"):
        call(cluster, 1, "PushQueue", collection="orphan", value=value)
    held_at = time.monotonic()
    held = cluster.consumers(2).Fetch(consumers_pb2.FetchRequest(
        stream="QUEUE_orphan", consumer="pop", batch=1), timeout=RPC_TIMEOUT_S).messages
    assert [m.payload for m in held] == [b"a"]
    assert call(cluster, 3, "PopQueue", collection="orphan").value == b"b"
    expect_error(cluster, 1, "PopQueue", Reason.QUEUE_EMPTY, collection="orphan")
    assert call(cluster, 1, "CountQueue", collection="orphan").count == 1  # held, not popped
    wait_s = limits.queue_pop_ack_wait_ms / 1000
    again = stub(cluster, 3).PopQueue(pb.PopQueueRequest(
        collection="orphan", max_wait_ms=int(wait_s * 1000) + 5_000),
        timeout=RPC_TIMEOUT_S + wait_s)
    assert again.value == b"a"
    assert time.monotonic() - held_at >= wait_s * 0.9
    assert call(cluster, 2, "CountQueue", collection="orphan").count == 0


def test_two_clients_popping_through_two_nodes_get_disjoint_values(
        cluster: LocalCluster) -> None:
    create(cluster, QUEUE, "race")
    pushed = {b"v%03d" % k for k in range(60)}
    for k, value in enumerate(sorted(pushed)):
        call(cluster, 1 + k % 3, "PushQueue", collection="race", value=value)
    popped: dict[int, list[bytes]] = {1: [], 2: []}
    errors: list[BaseException] = []

    def pop_all(i: int) -> None:
        try:
            while True:
                try:
                    popped[i].append(call(cluster, i, "PopQueue", collection="race").value)
                except grpc.RpcError as err:
                    if from_rpc_error(err) is not None and \
                            from_rpc_error(err).reason is Reason.QUEUE_EMPTY:  # type: ignore[union-attr]
                        return
                    raise
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pop_all, args=(i,)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RPC_TIMEOUT_S * 4)
    assert not errors, errors
    assert not set(popped[1]) & set(popped[2])
    assert sorted(popped[1] + popped[2]) == sorted(pushed)
    assert popped[1] and popped[2], "both clients should have popped something"


# ---------------------------------------------------------------------------- limits, input


def test_max_bytes_and_max_messages_refuse_writes_and_deletes_make_room(
        cluster: LocalCluster) -> None:
    create(cluster, HASH, "small", max_bytes=200)
    value = b"x" * 60
    written = 0
    with pytest.raises(grpc.RpcError) as info:
        for k in range(10):
            call(cluster, 1 + k % 3, "SetHashField", collection="small", key="k", field=f"f{k}",
                 value=value)
            written += 1
    assert from_rpc_error(info.value).reason is Reason.COLLECTION_FULL  # type: ignore[union-attr]
    assert written == 2  # each message: 60 bytes of value plus its subject
    assert call(cluster, 2, "GetCollectionInfo", kind=HASH, name="small").bytes <= 200
    # Replacing a value frees the old one's bytes; deleting a field makes room.
    call(cluster, 2, "SetHashField", collection="small", key="k", field="f0", value=value)
    call(cluster, 3, "DeleteHashField", collection="small", key="k", field="f0")
    call(cluster, 1, "SetHashField", collection="small", key="k", field="f9", value=value)

    create(cluster, QUEUE, "short", max_messages=2)
    for k in range(2):
        call(cluster, 2, "PushQueue", collection="short", value=b"%d" % k)
    metadata = expect_error(cluster, 3, "PushQueue", Reason.COLLECTION_FULL, collection="short",
                            value=b"2")
    assert metadata["limit"] == "2"
    call(cluster, 1, "PopQueue", collection="short")
    call(cluster, 3, "PushQueue", collection="short", value=b"2")

    create(cluster, SET, "tiny", max_bytes=30)
    call(cluster, 1, "AddSetMember", collection="tiny", key="k", member="m")
    expect_error(cluster, 2, "AddSetMember", Reason.COLLECTION_FULL, collection="tiny", key="k",
                 member="n" * 20)


def test_bad_input_gets_clear_errors_and_changes_nothing(cluster: LocalCluster) -> None:
    info = create(cluster, SET, "dup", ephemeral=True)
    assert (info.ephemeral, info.durable, info.stream) == (True, True, "SET_dup")
    expect_error(cluster, 2, "CreateCollection", Reason.COLLECTION_EXISTS, kind=SET, name="dup")
    again = call(cluster, 3, "CreateCollection", kind=SET, name="dup", ephemeral=True)
    assert again.stream == "SET_dup"  # the same settings again: a retried create succeeds
    for method, fields in [
        ("GetHashField", {"collection": "ghost", "key": "k", "field": "f"}),
        ("SetHashField", {"collection": "ghost", "key": "k", "field": "f"}),
        ("CountHashFields", {"collection": "ghost", "key": "k"}),
        ("AddSetMember", {"collection": "ghost", "key": "k", "member": "m"}),
        ("ListSetMembers", {"collection": "ghost", "key": "k"}),
        ("PushQueue", {"collection": "ghost"}),
        ("PopQueue", {"collection": "ghost"}),
        ("CountQueue", {"collection": "ghost"}),
        ("DeleteCollection", {"kind": QUEUE, "name": "ghost"}),
        ("GetCollectionInfo", {"kind": HASH, "name": "dup"}),  # a set of that name, no hash
    ]:
        expect_error(cluster, 3, method, Reason.COLLECTION_NOT_FOUND, **fields)
    for method, fields, reason in [
        ("CreateCollection", {"kind": HASH, "name": "a.b"}, Reason.INVALID_NAME),
        ("CreateCollection", {"kind": HASH, "name": ""}, Reason.INVALID_NAME),
        ("CreateCollection", {"kind": 0, "name": "x"}, Reason.INVALID_ARGUMENT),
        ("CreateCollection", {"kind": SET, "name": "x", "max_messages": 3},
         Reason.INVALID_ARGUMENT),
        ("AddSetMember", {"collection": "dup", "key": "", "member": "m"}, Reason.INVALID_ARGUMENT),
        ("AddSetMember", {"collection": "dup", "key": "k", "member": "m" * 121},
         Reason.INVALID_ARGUMENT),
        ("ListSetMembers", {"collection": "dup", "key": "k", "limit": 10_001},
         Reason.INVALID_ARGUMENT),
        ("PopQueue", {"collection": "x", "max_wait_ms": 10**6}, Reason.INVALID_ARGUMENT),
    ]:
        expect_error(cluster, 1, method, reason, **fields)
    assert call(cluster, 1, "CountSetMembers", collection="dup", key="k").count == 0

    # A stream made by hand with a collection's name is not a collection, and is not deleted.
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name="HASH_byhand")), timeout=RPC_TIMEOUT_S)
    wait_until(lambda: stream_readable(cluster, "HASH_byhand"), 10, interval_s=0.05,
               what="HASH_byhand serves reads")
    expect_error(cluster, 2, "DeleteCollection", Reason.COLLECTION_NOT_FOUND, kind=HASH,
                 name="byhand")
    expect_error(cluster, 2, "SetHashField", Reason.COLLECTION_NOT_FOUND, collection="byhand",
                 key="k", field="f")
    cluster.streams(3).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="HASH_byhand"),
                                     timeout=RPC_TIMEOUT_S)
    listed = call(cluster, 2, "ListCollections", kind=SET).collections
    assert "dup" in [c.name for c in listed] and all(c.kind == SET for c in listed)
    assert "byhand" not in [c.name for c in call(cluster, 2, "ListCollections").collections]

    call(cluster, 3, "DeleteCollection", kind=SET, name="dup")
    expect_error(cluster, 1, "IsSetMember", Reason.COLLECTION_NOT_FOUND, collection="dup",
                 key="k", member="m")


def stream_readable(cluster: LocalCluster, name: str) -> bool:
    try:
        cluster.streams(2).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name=name),
                                         timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return False
    return True


# -------------------------------------------------------------------------------------- CLI


def raftlog(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", *args, "--server", cluster.address(2)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)


def test_cli_sets_and_reads_a_field_and_says_when_a_queue_is_empty(
        cluster: LocalCluster) -> None:
    create(cluster, HASH, "cli")
    create(cluster, QUEUE, "cliq")
    done = raftlog(cluster, "hash", "set", "cli", "k", "f", "hello")
    assert done.returncode == 0, done.stderr
    got = raftlog(cluster, "hash", "get", "cli", "k", "f", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["value_text"] == "hello"
    empty = raftlog(cluster, "queue", "pop", "cliq")
    assert empty.returncode == 1
    assert "QUEUE_EMPTY" in empty.stderr


# --------------------------------------------------------------------------------- failover


def test_collections_keep_their_contents_when_the_primary_is_killed(
        cluster: LocalCluster) -> None:
    """Last in the module: kills a node."""
    create(cluster, HASH, "durable")
    create(cluster, SET, "durable")
    create(cluster, QUEUE, "durable")
    for k in range(5):
        call(cluster, 1 + k % 3, "SetHashField", collection="durable", key="k", field=f"f{k}",
             value=b"v%d" % k)
        call(cluster, 1 + k % 3, "AddSetMember", collection="durable", key="k", member=f"m{k}")
        call(cluster, 1 + k % 3, "PushQueue", collection="durable", value=b"q%d" % k)
    call(cluster, 2, "DeleteHashField", collection="durable", key="k", field="f4")
    assert call(cluster, 1, "PopQueue", collection="durable").value == b"q0"

    primary = route(cluster, "HASH_durable").primary
    victim = cluster.index_of(primary)
    cluster.kill9(victim)
    survivors = [i for i in (1, 2, 3) if i != victim]

    def readable() -> bool:
        try:
            call(cluster, survivors[0], "CountHashFields", collection="durable", key="k")
            call(cluster, survivors[0], "CountQueue", collection="durable")
            call(cluster, survivors[0], "CountSetMembers", collection="durable", key="k")
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(readable, FAILOVER_BOUND_S, interval_s=0.1, what="collections readable again")
    now = cluster.cluster(survivors[0]).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream="HASH_durable"), timeout=RPC_TIMEOUT_S)
    assert now.primary != primary
    everything = call(cluster, survivors[1], "GetHash", collection="durable", key="k")
    assert {e.field: e.value for e in everything.entries} == {
        f"f{k}": b"v%d" % k for k in range(4)}
    assert sorted(call(cluster, survivors[0], "ListSetMembers", collection="durable",
                       key="k").members) == [f"m{k}" for k in range(5)]
    assert call(cluster, survivors[1], "CountQueue", collection="durable").count == 4
    assert [call(cluster, survivors[k % 2], "PopQueue", collection="durable").value
            for k in range(4)] == [b"q1", b"q2", b"q3", b"q4"]
    call(cluster, survivors[0], "SetHashField", collection="durable", key="k", field="f4",
         value=b"after")
    assert call(cluster, survivors[1], "GetHashField", collection="durable", key="k",
                field="f4").value == b"after"
