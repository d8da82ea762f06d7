"""The Waymaker API's `result_code` for every raftlog error: one table per family of RPCs
(where the seed's codes differ), over one table shared by all.

A reason that no table names falls into one of two groups:
- transport-level, retryable conditions (gRPC status UNAVAILABLE, DEADLINE_EXCEEDED,
  RESOURCE_EXHAUSTED) and missing credentials (UNAUTHENTICATED, PERMISSION_DENIED): answered as
  that gRPC status with raftlog's ErrorInfo, not as a result_code. The seed has no code for
  "no primary right now, retry"; a Waymaker client, like any gRPC client, retries UNAVAILABLE
  (gRPC's retry policies and the seed's proxy do), whereas it takes `success=false` with
  "internal" as a final answer and would give up on a call that a second later succeeds;
- everything else: "internal", with raftlog's message.
"""

from __future__ import annotations

import enum

from raftlog.base.errors import Reason

OK = "ok"
INTERNAL = "internal"
NO_SUCH_BUCKET = "no_such_bucket"  # a KV bucket, or a hash, set or queue store
# Codes raftlog adds to the seed's lists (documented in docs/waymaker.md).
NOT_DELIVERED = "not_delivered"
NO_SUCH_KEY = "no_such_key"  # a Touch of a key with no live value
FULL = "full"  # a write past a store's max_bytes or a queue's max_messages
CONFLICT = "conflict"  # a collection write kept losing races; nothing changed, retry
TOO_LARGE = "too_large"  # an answer with no room for all it would hold (waymaker_kv.py ...)


class Family(enum.Enum):
    STREAM = "stream"  # stream lifecycle and direct reads
    PUBLISH = "publish"
    CONSUMER = "consumer"  # consumers, fetch, ack, nak, term, in-progress
    CLUSTER = "cluster"  # authority overrides, pinning, cluster stats
    MIGRATE = "migrate"  # MigrateStream and each step of RebalanceStreams
    KV = "kv"  # WaymakerKvService (waymaker_kv.py)
    COLLECTIONS = "collections"  # WaymakerCollectionsService (waymaker_collections.py)


_COMMON: dict[Reason, str] = {
    Reason.STREAM_NOT_FOUND: "no_such_stream",
    Reason.CONSUMER_NOT_FOUND: "no_such_consumer",
    Reason.STREAM_EXISTS: "already_exists",
    Reason.CONSUMER_EXISTS: "already_exists",
    Reason.INVALID_NAME: "invalid_config",
    Reason.INVALID_SUBJECT: "invalid_config",
    Reason.INVALID_CONFIG: "invalid_config",
    Reason.INVALID_ARGUMENT: "invalid_config",
    Reason.MALFORMED_REQUEST: "invalid_config",
    Reason.SUBJECT_NOT_IN_STREAM: "invalid_config",
    Reason.WORK_QUEUE_OVERLAP: "invalid_config",
    Reason.IMMUTABLE_FIELD: "immutable_field",
    Reason.MESSAGE_TOO_LARGE: "oversize",
    Reason.INSUFFICIENT_REPLICAS: "invalid_config",
}

_FAMILIES: dict[Family, dict[Reason, str]] = {
    Family.STREAM: {},
    Family.PUBLISH: {
        Reason.SUBJECT_NOT_IN_STREAM: "subject_rejected",
        Reason.INVALID_SUBJECT: "subject_rejected",
        Reason.MESSAGE_TOO_LARGE: "oversize",
        Reason.REQUEST_TOO_LARGE: "oversize",
        Reason.WRONG_LAST_SUBJECT_SEQ: "wrong_revision",
        Reason.WRONG_LAST_SEQ: "wrong_revision",
    },
    Family.CONSUMER: {
        Reason.NOT_DELIVERED: NOT_DELIVERED,
    },
    Family.CLUSTER: {
        Reason.NO_LEADER: "no_leader",
    },
    Family.MIGRATE: {
        Reason.STREAM_NOT_FOUND: "no_source",
        Reason.NODE_NOT_FOUND: "source_unreachable",
        Reason.NODE_UNREACHABLE: "source_unreachable",
        Reason.MEMBERSHIP_CHANGE_IN_PROGRESS: "source_busy",
        Reason.STREAM_PINNED: "source_busy",
    },
    Family.KV: {
        Reason.BUCKET_NOT_FOUND: NO_SUCH_BUCKET,
        Reason.BUCKET_EXISTS: "already_exists",
        Reason.KEY_EXISTS: "already_exists",
        Reason.WRONG_REVISION: "wrong_revision",
        Reason.INVALID_KEY: "invalid_key",
        Reason.INVALID_NAME: "invalid_config",
        Reason.VALUE_TOO_LARGE: "oversize",
        Reason.KEY_NOT_FOUND: NO_SUCH_KEY,
    },
    Family.COLLECTIONS: {
        Reason.COLLECTION_NOT_FOUND: NO_SUCH_BUCKET,
        Reason.COLLECTION_EXISTS: "already_exists",
        Reason.INVALID_KEY: "invalid_key",
        Reason.COLLECTION_FULL: FULL,
        Reason.COLLECTION_CONFLICT: CONFLICT,
    },
}

# gRPC statuses answered as a status rather than a result_code (see the module docstring).
STATUS_ANSWERED = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED",
                             "UNAUTHENTICATED", "PERMISSION_DENIED"})


def result_code(family: Family, reason: Reason) -> str | None:
    """The result_code for `reason` in an RPC of `family`; None when the error is answered
    as its gRPC status instead."""
    code = _FAMILIES[family].get(reason) or _COMMON.get(reason)
    if code is not None:
        return code
    if reason.status_name in STATUS_ANSWERED:
        return None
    return INTERNAL
