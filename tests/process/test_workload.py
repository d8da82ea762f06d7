"""The workload checker (chaos/workload.py) checked itself: on tiny inline histories (each
violation it must report, named after the rule), then against real nodes with no fault (the
report is clean) and with faults made on purpose (a purge, a duplicate published without a
msg_id, a consumer recreated so that acknowledged acks are undone: each is reported).

Processes are stopped by pid in fixtures; every wait is bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from raftlog.chaos import workload as wl
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import NodeProcess
from raftlog.internal import storage_pb2
from raftlog.v1 import consumers_pb2, streams_pb2

seed = 20_240_601
publish_count = 300
run_timeout_s = 30.0
drain_timeout_s = 10.0

# ---------------------------------------------------------------------------------------------
# Inline histories: no processes.


def _view(seq: int, msg_id: str, *, with_msg_id: bool = True) -> wl.StoredView:
    return wl.StoredView(seq, "s.0", msg_id if with_msg_id else "", msg_id)


def _contents(ids: dict[int, str], *, first_seq: int = 1, last_seq: int | None = None
              ) -> wl.StreamContents:
    last = max(ids, default=0) if last_seq is None else last_seq
    contents = wl.StreamContents("s", first_seq, last, last)
    contents.messages = {seq: _view(seq, msg_id) for seq, msg_id in ids.items()}
    return contents


def _published(acked: dict[str, int], *, unacked: tuple[str, ...] = ()) -> wl.PublishHistory:
    history = wl.PublishHistory(name="p", stream="s", seed=seed)
    for msg_id, seq in acked.items():
        history.sent.append(msg_id)
        history.acked[msg_id] = wl.Ack(msg_id, seq, False, 0.0, 0.0, "n1")
    history.sent += unacked
    return history


def _consumed(deliveries: list[tuple[int, str, float]], acks: list[tuple[int, float]]
              ) -> wl.ConsumeHistory:
    history = wl.ConsumeHistory(name="c", stream="s")
    history.deliveries = [wl.Delivery(seq, msg_id, 1, sent_at, sent_at, "n1")
                          for seq, msg_id, sent_at in deliveries]
    history.acks = [wl.AckDone((seq,), at, at, "n1") for seq, at in acks]
    return history


def _copy(node: str, stored: dict[int, str], *, commit_seq: int) -> wl.ReplicaCopy:
    encoded = {seq: storage_pb2.StoredMessage(subject="s.0", payload=f"wl1|{msg_id}|".encode(),
                                              msg_id=msg_id).SerializeToString()
               for seq, msg_id in stored.items()}
    return wl.ReplicaCopy(node, node, 1, 1, max(stored, default=0), commit_seq, encoded)


def test_clean_history_reports_nothing() -> None:
    contents = _contents({1: "a", 2: "b", 3: "c"})
    report = wl.check(seed=seed, contents=contents, published=[_published({"a": 1, "b": 2})],
                      consumed=[_consumed([(1, "a", 1.0), (2, "b", 1.0)], [(1, 2.0), (2, 2.0)])],
                      replicas=wl.ReplicaSurvey(copies=[
                          _copy("n1", {1: "a", 2: "b", 3: "c"}, commit_seq=3),
                          _copy("n2", {1: "a", 2: "b", 3: "c"}, commit_seq=3)]),
                      replicas_required=2)
    assert report.ok, report.summary()
    assert (report.acked, report.present, report.replicas_compared) == (2, 2, 2)


def test_an_acked_message_absent_from_the_stream_is_missing() -> None:
    report = wl.check(seed=seed, contents=_contents({2: "b"}, first_seq=2),
                      published=[_published({"a": 1, "b": 2})], quiet=True)
    assert report.acked_missing == ["a"]
    assert not report.ok and f"reproduce with seed={seed}" in report.summary()


def test_an_acked_message_stored_at_another_seq_is_at_the_wrong_seq() -> None:
    report = wl.check(seed=seed, contents=_contents({1: "b", 2: "a"}),
                      published=[_published({"a": 1})], quiet=True)
    assert report.acked_wrong_seq == [wl.WrongSeq("a", 1, (2,))]


def test_one_message_at_two_seqs_is_a_duplicate() -> None:
    contents = _contents({1: "a", 2: "a"})
    contents.messages[2] = _view(2, "a", with_msg_id=False)  # a retry without its msg_id
    report = wl.check(seed=seed, contents=contents, published=[_published({"a": 1})], quiet=True)
    assert report.duplicates == [("a", (1, 2))]


def test_a_seq_missing_between_head_and_last_is_a_gap() -> None:
    report = wl.check(seed=seed, contents=_contents({2: "b", 5: "e"}, first_seq=2, last_seq=7),
                      quiet=True)
    assert report.gaps == [(3, 4), (6, 7)]


def test_a_msg_id_field_that_disagrees_with_the_payload_is_corrupt() -> None:
    contents = _contents({1: "a"})
    contents.messages[1] = wl.StoredView(1, "s.0", "other", "a")
    assert wl.check(seed=seed, contents=contents, quiet=True).corrupt == [1]


def test_unacked_messages_are_counted_not_reported() -> None:
    report = wl.check(seed=seed, contents=_contents({1: "a", 2: "x"}),
                      published=[_published({"a": 1}, unacked=("x", "y"))])
    assert report.ok
    assert (report.unacked_present, report.unacked_absent) == (1, 1)


def test_a_delivery_fetched_after_its_ack_was_acknowledged_undoes_the_ack() -> None:
    consumed = _consumed([(1, "a", 1.0), (1, "a", 3.0)], [(1, 2.0)])
    report = wl.check(seed=seed, contents=_contents({1: "a"}), consumed=[consumed], quiet=True)
    assert report.acks_undone == [wl.AckUndone("c", 1, 2.0, 3.0, 1)]


def test_a_redelivery_fetched_before_the_ack_was_acknowledged_is_allowed() -> None:
    consumed = _consumed([(1, "a", 1.0), (1, "a", 1.5)], [(1, 2.0)])
    assert wl.check(seed=seed, contents=_contents({1: "a"}), consumed=[consumed]).ok


def test_an_ack_acknowledged_to_one_client_undone_for_another_is_reported() -> None:
    first = _consumed([(1, "a", 1.0)], [(1, 2.0)])
    second = _consumed([(1, "a", 3.0)], [])  # another client of the same durable consumer
    report = wl.check(seed=seed, contents=_contents({1: "a"}), consumed=[first, second],
                      quiet=True)
    assert [undone.seq for undone in report.acks_undone] == [1]


def test_a_delivery_of_a_message_not_stored_is_reported() -> None:
    consumed = _consumed([(1, "a", 1.0), (2, "ghost", 1.0)], [])
    report = wl.check(seed=seed, contents=_contents({1: "a"}), consumed=[consumed], quiet=True)
    assert [d.seq for d in report.delivered_not_stored] == [2]


def test_a_drained_consumer_that_never_saw_a_stored_message_is_reported() -> None:
    consumed = _consumed([(1, "a", 1.0)], [(1, 2.0)])
    consumed.drained = True
    report = wl.check(seed=seed, contents=_contents({1: "a", 2: "b"}), consumed=[consumed],
                      quiet=True)
    assert report.undelivered == [("c", 2)]


def test_an_ack_floor_below_the_acknowledged_prefix_is_reported() -> None:
    consumed = _consumed([(1, "a", 1.0), (2, "b", 1.0)], [(1, 2.0), (2, 2.0)])
    consumed.final_state = consumers_pb2.ConsumerState(ack_floor=1)
    report = wl.check(seed=seed, contents=_contents({1: "a", 2: "b"}), consumed=[consumed],
                      quiet=True)
    assert report.ack_floor_behind == [("c", 1, 2)]


def test_replicas_that_differ_on_the_committed_prefix_diverge() -> None:
    survey = wl.ReplicaSurvey(copies=[_copy("n1", {1: "a", 2: "b", 3: "c"}, commit_seq=3),
                                      _copy("n2", {1: "a", 2: "X", 3: "c"}, commit_seq=3),
                                      _copy("n3", {1: "a", 3: "c"}, commit_seq=3)])
    report = wl.check(seed=seed, contents=_contents({1: "a", 2: "b", 3: "c"}), replicas=survey,
                      quiet=True)
    assert wl.Divergence(2, "missing", ("n3",)) in report.divergence
    assert wl.Divergence(2, "differs", ("n1", "n2")) in report.divergence


def test_replicas_are_compared_only_up_to_the_lowest_commit_seq() -> None:
    survey = wl.ReplicaSurvey(copies=[_copy("n1", {1: "a", 2: "b"}, commit_seq=2),
                                      _copy("n2", {1: "a", 2: "Z"}, commit_seq=1)])
    report = wl.check(seed=seed, contents=_contents({1: "a", 2: "b"}), replicas=survey)
    assert report.ok and report.committed_prefix == 1


def test_full_prefix_compares_up_to_the_primarys_commit_seq() -> None:
    survey = wl.ReplicaSurvey(primary="n1", copies=[_copy("n1", {1: "a", 2: "b"}, commit_seq=2),
                                                    _copy("n2", {1: "a"}, commit_seq=1)])
    report = wl.check(seed=seed, contents=_contents({1: "a", 2: "b"}), replicas=survey,
                      full_prefix=True, quiet=True)
    assert report.divergence == [wl.Divergence(2, "missing", ("n2",))]


def test_fewer_replicas_than_required_fails() -> None:
    report = wl.check(seed=seed, contents=_contents({1: "a"}), replicas=wl.ReplicaSurvey(),
                      replicas_required=3, quiet=True)
    assert report.violations() == {"replicas_short": 3}


def test_failover_timing_counts_from_the_fault_to_the_first_ack_of_a_later_send() -> None:
    history = wl.PublishHistory(name="p", stream="s", seed=seed)
    history.attempts = [wl.Attempt("a", "n1", 0.0, 0.1, seq=1),
                        wl.Attempt("b", "n1", 0.9, 1.5, seq=2),  # in flight at the fault
                        wl.Attempt("c", "n1", 1.6, 1.8, error="UNAVAILABLE"),
                        wl.Attempt("c", "n2", 1.9, 2.4, seq=3)]
    timing = wl.failover_timing([history], fault_at=1.0)
    assert timing.recover_s == pytest.approx(1.4)
    assert timing.first_ack_s == pytest.approx(0.5)
    assert timing.outage_s == pytest.approx(1.4)
    assert (timing.acked_before, timing.acked_after) == (1, 2)


def test_payloads_carry_their_msg_id() -> None:
    import random

    payload = wl.encode_payload(msg_id="p-1f-7", size_bytes=64, rng=random.Random(1))
    assert len(payload) == 64 and wl.decode_payload(payload) == "p-1f-7"
    assert wl.decode_payload(b"plain") is None


# ---------------------------------------------------------------------------------------------
# Real nodes.


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path_factory.mktemp("workload") / "node1").start()
    try:
        yield process
    finally:
        process.cleanup()


async def _run(addresses: list[str], stream: str, *, replicas: int = 1,
               consumer: bool = True) -> tuple[wl.PublishHistory, wl.PublishHistory,
                                               wl.ConsumeHistory | None]:
    """A unary and a batch publisher (publish_count each) and, optionally, a consumer that
    drains; returns their histories."""
    await wl.create_stream(addresses, stream, subjects=[f"{stream}.>"], replicas=replicas)
    unary = wl.Publisher(addresses, wl.PublisherConfig(
        stream=stream, subject_prefix=f"{stream}.u", name="u", subjects=3,
        count_max=publish_count, duration_s_max=run_timeout_s), seed=seed)
    batch = wl.Publisher(addresses, wl.PublisherConfig(
        stream=stream, subject_prefix=f"{stream}.b", name="b", batch_size=25,
        count_max=publish_count, duration_s_max=run_timeout_s), seed=seed)
    reader = wl.Consumer(addresses, wl.ConsumerConfig(stream=stream, duration_s_max=run_timeout_s),
                         seed=seed) if consumer else None
    task = None
    if reader is not None:
        await reader.create()
        task = asyncio.create_task(reader.run())
    histories = await asyncio.gather(unary.run(), batch.run())
    consumed = None
    if reader is not None and task is not None:
        reader.stop(drain_timeout_s=drain_timeout_s)
        consumed = await task
    assert all(len(h.acked) == publish_count for h in histories), [h.errors() for h in histories]
    return histories[0], histories[1], consumed


def test_no_fault_on_one_node_is_clean(node: NodeProcess) -> None:
    async def scenario() -> wl.Report:
        unary, batch, consumed = await _run([node.address], "clean1")
        assert consumed is not None and consumed.drained
        return await wl.audit([node.address], "clean1", seed=seed, published=[unary, batch],
                              consumed=[consumed])

    report = asyncio.run(scenario())
    assert report.ok, report.summary()
    assert report.acked == report.present == 2 * publish_count


def test_a_purged_range_is_reported_missing(node: NodeProcess) -> None:
    async def scenario() -> wl.Report:
        unary, batch, _ = await _run([node.address], "purged", consumer=False)
        nodes = wl.Nodes([node.address])
        try:
            await nodes.streams().PurgeStream(
                streams_pb2.PurgeStreamRequest(name="purged", below_seq=11), timeout=5)
        finally:
            await nodes.close()
        return await wl.audit([node.address], "purged", seed=seed, published=[unary, batch],
                              quiet=True)

    report = asyncio.run(scenario())
    assert len(report.acked_missing) == 10
    assert set(report.violations()) == {"acked_missing"}


def test_a_duplicate_published_without_msg_id_is_reported(node: NodeProcess) -> None:
    async def scenario() -> wl.Report:
        unary, batch, _ = await _run([node.address], "dup", consumer=False)
        first = unary.acked[unary.sent[0]]
        again = wl.Publisher([node.address], wl.PublisherConfig(
            stream="dup", subject_prefix="dup.u", name="u", count_max=1, use_msg_id=False),
            seed=seed)  # the same seed and name: the same payload as the first message
        retried = await again.run()
        assert retried.acked[first.msg_id].seq != first.seq
        return await wl.audit([node.address], "dup", seed=seed, published=[unary, batch],
                              quiet=True)

    report = asyncio.run(scenario())
    assert [msg_id for msg_id, _ in report.duplicates] == [f"u-{seed:x}-1"]
    assert set(report.violations()) == {"duplicates"}


def test_a_recreated_consumer_undoes_acknowledged_acks(node: NodeProcess) -> None:
    async def scenario() -> wl.Report:
        unary, batch, consumed = await _run([node.address], "undone")
        assert consumed is not None
        nodes = wl.Nodes([node.address])
        try:
            await nodes.consumers().DeleteConsumer(
                consumers_pb2.DeleteConsumerRequest(stream="undone", consumer="wl"), timeout=5)
        finally:
            await nodes.close()
        second = wl.Consumer([node.address], wl.ConsumerConfig(stream="undone"), seed=seed)
        await second.create()  # the same name: the same durable consumer, as far as users know
        task = asyncio.create_task(second.run())
        await asyncio.sleep(0.5)
        second.stop(drain_timeout_s=drain_timeout_s)
        again = await task
        merged = wl.ConsumeHistory(name="wl", stream="undone",
                                   deliveries=consumed.deliveries + again.deliveries,
                                   acks=consumed.acks + again.acks)
        return await wl.audit([node.address], "undone", seed=seed, published=[unary, batch],
                              consumed=[merged], quiet=True)

    report = asyncio.run(scenario())
    assert len(report.acks_undone) == 2 * publish_count
    assert set(report.violations()) == {"acks_undone"}


def test_no_fault_on_three_nodes_is_clean(cluster3: LocalCluster) -> None:
    addresses = [cluster3.address(i) for i in (1, 2, 3)]

    async def scenario() -> wl.Report:
        unary, batch, consumed = await _run(addresses, "clean3", replicas=3)
        assert consumed is not None and consumed.drained
        return await wl.audit(addresses, "clean3", seed=seed, published=[unary, batch],
                              consumed=[consumed])

    report = asyncio.run(scenario())
    assert report.ok, report.summary()
    assert report.acked == report.present == 2 * publish_count


def test_no_fault_on_three_nodes_leaves_three_identical_replicas(cluster3: LocalCluster) -> None:
    addresses = [cluster3.address(i) for i in (1, 2, 3)]

    async def scenario() -> wl.Report:
        unary, batch, _ = await _run(addresses, "same3", replicas=3, consumer=False)
        return await wl.audit(addresses, "same3", seed=seed, published=[unary, batch],
                              replicas_required=3, peer=cluster3.peer_access())

    report = asyncio.run(scenario())
    assert report.ok, report.summary()
    assert report.committed_prefix == 2 * publish_count
