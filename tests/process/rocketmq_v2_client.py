"""Drives the real rocketmq-python-client (PyPI, 5.1.2) against a raftlog node, in a process of
its own: the client's generated apache.rocketmq.v2 protos and raftlog's own restatement of them
would collide in one descriptor pool. tests/process/test_rocketmq_v2.py runs it; each mode
prints one JSON document on stdout.

    produce ENDPOINT TOPIC COUNT PREFIX [GROUPS] send COUNT messages, print the receipts;
                                                 with GROUPS (a,b,...) FIFO ones, message i
                                                 in group i % len(GROUPS)
    consume ENDPOINT TOPIC GROUP JSON_PLAN       receive as the plan says, print what came
    rounds ENDPOINT TOPIC GROUP ROUNDS AWAIT_S   ROUNDS times: send one message, then one
                                                 receive (a long poll of AWAIT_S), ack what
                                                 came; print each round's bodies and time
    push ENDPOINT TOPIC GROUP RUN_S [GOOD BAD QUIET_S]
                                                 a PushConsumer whose listener fails "bad*"
                                                 messages, for RUN_S seconds; or, with GOOD
                                                 and BAD, until it consumed GOOD distinct
                                                 other ones and was called BAD times for
                                                 "bad*" ones, then QUIET_S seconds more (any
                                                 call past those shows), RUN_S at most
    delayed ENDPOINT TOPIC DELAY_MS              send one message due DELAY_MS from now
    recall ENDPOINT TOPIC DELAY_MS               send one message due DELAY_MS from now, recall
                                                 it, then recall it again
    transactional ENDPOINT TOPIC WAIT_S          commit one, roll back one, leave one to the
                                                 server's question (the checker commits it)

The consume plan: {"expect": N, "invisible_s": S, "leave_unacked": K, "change_invisible_s":
C, "timeout_s": T, "never_ack": false}: receive (invisible for S seconds) until N distinct
message ids are acked; the first K messages received are left unacked once (their redelivery
is acked), the first of those after a ChangeInvisibleDuration to C seconds when C > 0. With
never_ack, nothing is acked: it receives until T.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from concurrent.futures import Future
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import Code

logging.disable(logging.WARNING)


def _config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=5)


def _message(topic: str, body: str) -> Message:
    message = Message()
    message.topic = topic
    message.body = body.encode()
    return message


def produce(endpoint: str, topic: str, count: int, prefix: str,
            groups: list[str]) -> list[dict[str, Any]]:
    producer = Producer(_config(endpoint), (topic,))
    producer.startup()
    sent = []
    try:
        for i in range(count):
            message = _message(topic, f"{prefix}-{i}")
            message.tag = "even" if i % 2 == 0 else "odd"
            message.keys = f"key-{i}"
            message.add_property("index", str(i))
            if groups:
                message.message_group = groups[i % len(groups)]
            receipt = producer.send(message)
            sent.append({"message_id": receipt.message_id, "body": f"{prefix}-{i}",
                         "offset": receipt.offset})
    finally:
        producer.shutdown()
    return sent


def consume(endpoint: str, topic: str, group: str, plan: dict[str, Any]) -> dict[str, Any]:
    consumer = SimpleConsumer(_config(endpoint), group, {topic: FilterExpression("*")},
                              await_duration=2)
    consumer.startup()
    acked: dict[str, dict[str, Any]] = {}
    seen: list[dict[str, Any]] = []
    left: set[str] = set()
    changed = ""
    errors: list[str] = []
    deadline = time.monotonic() + plan["timeout_s"]
    try:
        while len(acked) < plan["expect"] and time.monotonic() < deadline:
            try:
                messages = consumer.receive(16, plan["invisible_s"])
            except Exception as err:  # a queue whose node is gone: the next receive moves on
                errors.append(f"{type(err).__name__}: {err}")
                time.sleep(0.2)
                continue
            for message in messages:
                record = {"message_id": message.message_id, "body": message.body.decode(),
                          "tag": message.tag, "keys": sorted(message.keys),
                          "properties": dict(message.properties),
                          "attempt": message.delivery_attempt,
                          "group": message.message_group or "",
                          "at": round(time.monotonic(), 3),
                          "wall_ms": int(time.time() * 1000)}
                seen.append(record)
                if message.message_id in acked:
                    continue
                if plan.get("never_ack"):
                    continue
                if len(left) < plan["leave_unacked"] and message.message_id not in left:
                    left.add(message.message_id)
                    if not changed and plan["change_invisible_s"] > 0:
                        consumer.change_invisible_duration(message, plan["change_invisible_s"])
                        changed = message.message_id
                    continue
                consumer.ack(message)
                acked[message.message_id] = record
    finally:
        consumer.shutdown()
    return {"acked": list(acked.values()), "seen": seen, "left": sorted(left),
            "changed": changed, "errors": errors[:5]}


def rounds(endpoint: str, topic: str, group: str, count: int, await_s: int
           ) -> list[dict[str, Any]]:
    producer = Producer(_config(endpoint), (topic,))
    consumer = SimpleConsumer(_config(endpoint), group, {topic: FilterExpression("*")},
                              await_duration=await_s)
    producer.startup()
    consumer.startup()
    done = []
    try:
        for i in range(count):
            producer.send(_message(topic, f"r-{i}"))
            started = time.monotonic()
            received = consumer.receive(16, 30)
            took_s = time.monotonic() - started
            for got in received:
                consumer.ack(got)
            done.append({"bodies": [got.body.decode() for got in received],
                         "took_s": round(took_s, 3)})
    finally:
        consumer.shutdown()
        producer.shutdown()
    return done


class _Listener(MessageListener):
    """Fails every message whose body starts with "bad", consumes the others; notes each."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def consume(self, message: Message) -> ConsumeResult:
        body = message.body.decode()
        self.seen.append({"message_id": message.message_id, "body": body,
                          "attempt": message.delivery_attempt})
        return ConsumeResult.FAILURE if body.startswith("bad") else ConsumeResult.SUCCESS


def push(endpoint: str, topic: str, group: str, run_s: float,
         until: tuple[int, int, float] | None = None) -> list[dict[str, Any]]:
    """A PushConsumer of `group` for `run_s` seconds, or until `until` (good, bad, quiet_s)
    as the module says; prints every call of its listener."""
    listener = _Listener()
    consumer = PushConsumer(_config(endpoint), group, listener,
                            {topic: FilterExpression("*")})
    consumer.startup()
    deadline = time.monotonic() + run_s
    try:
        while time.monotonic() < deadline:
            if until is not None and _pushed_all(listener.seen, until[0], until[1]):
                time.sleep(max(0.0, min(deadline - time.monotonic(), until[2])))
                break
            time.sleep(0.1)
    finally:
        consumer.shutdown()
    return listener.seen


def _pushed_all(seen: list[dict[str, Any]], good: int, bad: int) -> bool:
    calls = list(seen)  # the listener's threads append meanwhile
    done = {m["message_id"] for m in calls if not m["body"].startswith("bad")}
    return len(done) >= good and sum(m["body"].startswith("bad") for m in calls) >= bad


class _Checker(TransactionChecker):
    """Answers the server's questions about open transactions: COMMIT, noting each."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def check(self, message: Message) -> TransactionResolution:
        self.asked.append(message.body.decode())
        return TransactionResolution.COMMIT


def delayed(endpoint: str, topic: str, delay_ms: int) -> dict[str, Any]:
    """Sends one message due `delay_ms` from now; prints its id and when it was sent."""
    producer = Producer(_config(endpoint), (topic,))
    producer.startup()
    try:
        message = _message(topic, "later")
        sent_ms = int(time.time() * 1000)
        message.delivery_timestamp = sent_ms + delay_ms
        receipt = producer.send(message)
    finally:
        producer.shutdown()
    return {"message_id": receipt.message_id, "sent_ms": sent_ms}


def recall(endpoint: str, topic: str, delay_ms: int) -> dict[str, Any]:
    """Sends one message due `delay_ms` from now and recalls it twice with the handle its
    receipt gave; prints the handle, each recall's answer (the id, or the error) and when
    the message was due."""
    producer = Producer(_config(endpoint), (topic,))
    producer.startup()
    answers: list[dict[str, Any]] = []
    try:
        message = _message(topic, "recalled")
        due_ms = int(time.time() * 1000) + delay_ms
        message.delivery_timestamp = due_ms
        receipt = producer.send(message)
        for _ in range(2):
            try:
                answers.append({"message_id": producer.recall_message(
                    topic, receipt.recall_handle)})
            except Exception as err:  # the client's exception for a refused recall
                answers.append({"error": type(err).__name__, "text": str(err)})
    finally:
        producer.shutdown()
    return {"message_id": receipt.message_id, "recall_handle": receipt.recall_handle,
            "due_ms": due_ms, "answers": answers}


def _track_end_transactions(producer: Producer) -> list[Future[Any]]:
    """The futures of the producer's EndTransaction calls, in the order they were sent."""
    rpc = producer.rpc_client
    send = rpc.end_transaction_async
    sent: list[Future[Any]] = []

    def tracked(*args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = send(*args, **kwargs)
        sent.append(future)
        return future

    rpc.end_transaction_async = tracked
    return sent


def _answered_ok(futures: list[Future[Any]]) -> bool:
    return any(f.done() and f.exception() is None and f.result().status.code == Code.OK
               for f in futures)


def transactional(endpoint: str, topic: str, wait_s: float) -> dict[str, Any]:
    """Three transactional sends: "commit" is committed, "rollback" rolled back, "orphan" left
    open until the server asks about it (the checker commits it); waits at most `wait_s` for
    the server's OK to the checker's answer."""
    checker = _Checker()
    producer = Producer(_config(endpoint), (topic,), checker=checker)
    producer.startup()
    ends = _track_end_transactions(producer)
    ids = {}
    try:
        for body in ("commit", "rollback", "orphan"):
            message = _message(topic, body)
            transaction = producer.begin_transaction()
            ids[body] = producer.send(message, transaction).message_id
            if body == "commit":
                transaction.commit()
            elif body == "rollback":
                transaction.rollback()
        checked_from = len(ends)  # what follows is the checker's
        deadline = time.monotonic() + wait_s
        # The checker's answer goes out behind check() as an EndTransaction the client keeps
        # no handle on; one cut off by shutdown would leave the orphan open. So the producer
        # stays up until the server has answered one OK (or asks again, bounded by wait_s).
        while not _answered_ok(ends[checked_from:]) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        producer.shutdown()
    return {"ids": ids, "asked": checker.asked}


def main(argv: list[str]) -> None:
    mode, endpoint, topic, *rest = argv
    if mode == "produce":
        out: Any = produce(endpoint, topic, int(rest[0]), rest[1],
                           rest[2].split(",") if len(rest) > 2 else [])
    elif mode == "consume":
        out = consume(endpoint, topic, rest[0], json.loads(rest[1]))
    elif mode == "rounds":
        out = rounds(endpoint, topic, rest[0], int(rest[1]), int(rest[2]))
    elif mode == "push":
        until = (int(rest[2]), int(rest[3]), float(rest[4])) if len(rest) > 2 else None
        out = push(endpoint, topic, rest[0], float(rest[1]), until)
    elif mode == "delayed":
        out = delayed(endpoint, topic, int(rest[0]))
    elif mode == "recall":
        out = recall(endpoint, topic, int(rest[0]))
    elif mode == "transactional":
        out = transactional(endpoint, topic, float(rest[0]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
