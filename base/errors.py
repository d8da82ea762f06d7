"""The one error catalogue: every failure a client can see, its gRPC status and stable reason.
Knows no gRPC: a reason names its status code as text; node/transport/rpc.py maps it.

Code raises `RaftlogError(Reason.X, "human text", key=value...)`; the gRPC layer turns it into a
status with a google.rpc.ErrorInfo detail (domain "raftlog", reason = the enum name, metadata =
the keyword arguments as strings), and a batch turns it into a `raftlog.v1.Error` entry.
"""

from __future__ import annotations

import enum

ERROR_DOMAIN = "raftlog"


class Reason(enum.Enum):
    """Stable machine-readable reasons. Names are part of the API: only ever add.

    Each member is declared with the name of its gRPC status code; members get distinct values
    so that two reasons with the same status never become aliases of each other."""

    status_name: str

    def __new__(cls, status_name: str) -> Reason:
        member = object.__new__(cls)
        member._value_ = len(cls.__members__) + 1
        member.status_name = status_name
        return member

    # INVALID_ARGUMENT: the request itself is wrong, whatever the state.
    INVALID_NAME = "INVALID_ARGUMENT"
    INVALID_SUBJECT = "INVALID_ARGUMENT"
    INVALID_CONFIG = "INVALID_ARGUMENT"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    SUBJECT_NOT_IN_STREAM = "INVALID_ARGUMENT"
    MESSAGE_TOO_LARGE = "INVALID_ARGUMENT"
    IMMUTABLE_FIELD = "INVALID_ARGUMENT"
    # NOT_FOUND
    STREAM_NOT_FOUND = "NOT_FOUND"
    CONSUMER_NOT_FOUND = "NOT_FOUND"
    MESSAGE_NOT_FOUND = "NOT_FOUND"
    NODE_NOT_FOUND = "NOT_FOUND"
    # ALREADY_EXISTS
    STREAM_EXISTS = "ALREADY_EXISTS"
    CONSUMER_EXISTS = "ALREADY_EXISTS"
    NODE_EXISTS = "ALREADY_EXISTS"
    # FAILED_PRECONDITION: the request is fine but the state does not allow it.
    WRONG_LAST_SEQ = "FAILED_PRECONDITION"
    WRONG_LAST_SUBJECT_SEQ = "FAILED_PRECONDITION"
    NOT_DELIVERED = "FAILED_PRECONDITION"
    WORK_QUEUE_OVERLAP = "FAILED_PRECONDITION"
    STALE_EPOCH = "FAILED_PRECONDITION"
    SEQ_GAP = "FAILED_PRECONDITION"
    LAST_MEMBER = "FAILED_PRECONDITION"
    MEMBERSHIP_CHANGE_IN_PROGRESS = "FAILED_PRECONDITION"
    NODE_IN_USE = "FAILED_PRECONDITION"  # a member that still holds streams cannot leave
    STREAM_PINNED = "FAILED_PRECONDITION"  # a pinned stream keeps its authority
    # RESOURCE_EXHAUSTED: a limit or a full queue.
    TOO_MANY_STREAMS = "RESOURCE_EXHAUSTED"
    TOO_MANY_CONSUMERS = "RESOURCE_EXHAUSTED"
    BATCH_TOO_LARGE = "RESOURCE_EXHAUSTED"
    REQUEST_TOO_LARGE = "RESOURCE_EXHAUSTED"
    STREAM_FULL = "RESOURCE_EXHAUSTED"
    OVERLOADED = "RESOURCE_EXHAUSTED"
    # UNAVAILABLE: try again (maybe elsewhere).
    NO_LEADER = "UNAVAILABLE"
    NO_QUORUM = "UNAVAILABLE"
    NOT_PRIMARY = "UNAVAILABLE"
    SHUTTING_DOWN = "UNAVAILABLE"
    FORWARD_FAILED = "UNAVAILABLE"
    HOP_LIMIT = "UNAVAILABLE"
    # DEADLINE_EXCEEDED
    TIMEOUT = "DEADLINE_EXCEEDED"
    # UNAUTHENTICATED / PERMISSION_DENIED
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    # INTERNAL: a bug or a corrupt store; never silently ignored.
    INTERNAL = "INTERNAL"
    CORRUPT_RECORD = "DATA_LOSS"
    # Added later (names only ever appended):
    # UNAVAILABLE: this node has not caught up with the cluster's metadata (or a new primary
    # with the stream's commit seq) and cannot yet say; retry, after retry_after_ms if given.
    CATCHING_UP = "UNAVAILABLE"
    # Appended (names and values are part of the API).
    NODE_UNREACHABLE = "FAILED_PRECONDITION"  # a joining node did not answer as a member
    # Appended for bad input and resource bounds:
    MALFORMED_REQUEST = "INVALID_ARGUMENT"  # request bytes that do not parse as the method's type
    # limits.subscriptions_max calls are open on the node, or a stream's max_subscriptions on
    # the stream (metadata `stream`):
    TOO_MANY_SUBSCRIPTIONS = "RESOURCE_EXHAUSTED"
    # Appended for the audit's repair (raftlog audit repair):
    COPY_IS_PRIMARY = "FAILED_PRECONDITION"  # a repair of the copy a serving primary holds
    COPY_CHANGED = "FAILED_PRECONDITION"  # the copy is no longer where the repair plan saw it
    # Appended for the audit's export (Cluster.ExportAudit):
    EXPORT_RUNNING = "RESOURCE_EXHAUSTED"  # the node runs an export already (one at a time)
    # Appended for the audit's consumer repair (Cluster.SetConsumerState,
    # Replication.RepairConsumer):
    CONSUMER_CHANGED = "FAILED_PRECONDITION"  # the consumer moved since the repair plan saw it
    PAST_COMMITTED_END = "OUT_OF_RANGE"  # a consumer seq past the stream's committed end
    # Appended for the object store (ops/objects.py):
    BUCKET_NOT_FOUND = "NOT_FOUND"
    OBJECT_NOT_FOUND = "NOT_FOUND"  # never put, or its latest revision is a tombstone
    BUCKET_EXISTS = "ALREADY_EXISTS"
    SHA_MISMATCH = "INVALID_ARGUMENT"  # a put's content does not hash to the sha256 it named
    OBJECT_TOO_LARGE = "FAILED_PRECONDITION"  # past a unary reply's limit: use the stream
    OBJECT_INCOMPLETE = "DATA_LOSS"  # a live revision misses a chunk
    OBJECT_CORRUPT = "DATA_LOSS"  # the stored chunks do not hash to the revision's sha256
    OBJECT_CHANGED = "ABORTED"  # replaced or deleted while it was read: read it again
    UPLOAD_ABANDONED = "ABORTED"  # an upload idle so long that its chunks were collected
    # Appended for KV buckets (ops/kv.py; BUCKET_NOT_FOUND and BUCKET_EXISTS above serve them
    # too):
    KEY_NOT_FOUND = "NOT_FOUND"  # never written, deleted, purged or past its TTL
    KEY_EXISTS = "ALREADY_EXISTS"  # a Create of a key that has a live value
    WRONG_REVISION = "FAILED_PRECONDITION"  # metadata `revision`: the key's latest revision
    INVALID_KEY = "INVALID_ARGUMENT"  # not 1+ dot-separated tokens of [-/_=a-zA-Z0-9]
    VALUE_TOO_LARGE = "INVALID_ARGUMENT"  # above the bucket's max_value_size
    TOO_MANY_KEYS = "RESOURCE_EXHAUSTED"  # a watch's start would list more keys than it may
    # Appended for collections (ops/collections.py: hashes, sets and queues):
    COLLECTION_NOT_FOUND = "NOT_FOUND"  # no hash, set or queue of that name
    COLLECTION_EXISTS = "ALREADY_EXISTS"  # a create of a name that is taken (or its stream is)
    FIELD_NOT_FOUND = "NOT_FOUND"  # a hash key has no live value at that field
    QUEUE_EMPTY = "FAILED_PRECONDITION"  # a pop found nothing to hand out within its wait
    COLLECTION_FULL = "RESOURCE_EXHAUSTED"  # a write past the collection's max_bytes/max_messages
    COLLECTION_CONFLICT = "ABORTED"  # kept losing races to other writers: retry
    # Appended for topics (ops/partitions.py, docs/partitions.md):
    TOPIC_NOT_FOUND = "NOT_FOUND"
    TOPIC_EXISTS = "ALREADY_EXISTS"  # a create with another partition count or stream config
    TOPIC_INCOMPLETE = "FAILED_PRECONDITION"  # a partition stream is missing: create again
    PARTITION_OUT_OF_RANGE = "OUT_OF_RANGE"  # a partition index at or past the topic's count
    # Appended for the Kafka-Pixy front-end (node/api/kafkapixy.py, docs/kafkapixy.md):
    LONG_POLL_TIMEOUT = "NOT_FOUND"  # ConsumeNAck found no message within its wait
    # A create asking for more copies than the cluster has members (never quietly lowered):
    INSUFFICIENT_REPLICAS = "FAILED_PRECONDITION"
    # Appended for transactions (ops/transactions.py, docs/transactions.md):
    TRANSACTION_NOT_FOUND = "NOT_FOUND"  # never prepared, rolled back, or forgotten
    TRANSACTION_ENDED = "FAILED_PRECONDITION"  # a rollback of a committed transaction
    # Appended for quotas (docs/quotas.md); both carry retry_after_ms in their metadata:
    RATE_LIMITED = "RESOURCE_EXHAUSTED"  # a publish past its stream's msgs/s or bytes/s quota
    TOO_MANY_CONNECTIONS = "RESOURCE_EXHAUSTED"  # --connections-max clients have calls open
    # Appended for users (raft/state_users.py, docs/auth.md):
    USER_NOT_FOUND = "NOT_FOUND"
    USER_EXISTS = "ALREADY_EXISTS"
    # Appended for per-user quotas (docs/quotas.md): a create or update past the user's
    # max_bytes_stored, or one more connection or subscription than the user may hold.
    QUOTA_EXCEEDED = "RESOURCE_EXHAUSTED"



class RaftlogError(Exception):
    """A failure with a catalogued reason; `metadata` values end up in ErrorInfo.metadata."""

    def __init__(self, reason: Reason, message: str, **metadata: object) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = {key: str(value) for key, value in metadata.items()}

    @property
    def status_name(self) -> str:
        """The name of the gRPC status code (transport/rpc.py maps it)."""
        return self.reason.status_name

    def __repr__(self) -> str:
        return f"RaftlogError({self.reason.name}, {self.message!r}, {self.metadata!r})"


class InvariantViolation(Exception):
    """A safety check failed: the node's state is not what the code relies on. Never caught
    to carry on; survives `python -O` unlike `assert`."""
