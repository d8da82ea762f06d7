"""The canonical form of every operation: the raftlog.v1 request and answer, and the method path
a node that does not serve a call forwards it by. Every front-end translates its protocol into
these requests, so the routing knows only these names.
"""

from __future__ import annotations

from typing import Any, TypeVar

from google.protobuf.message import Message

from raftlog.node.transport.forwarding import Forward
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, topics_pb2, types_pb2

M = TypeVar("M", bound=Message)


def _forward(service: Any, method: str, answer: type[M]) -> Forward[M]:
    full_name = service.full_name
    if method not in service.methods_by_name:
        raise KeyError(f"{full_name} has no method {method}")
    return Forward(path=f"/{full_name}/{method}", parse=answer.FromString)


_STREAMS = streams_pb2.DESCRIPTOR.services_by_name["Streams"]
_CONSUMERS = consumers_pb2.DESCRIPTOR.services_by_name["Consumers"]
_CLUSTER = cluster_pb2.DESCRIPTOR.services_by_name["Cluster"]
_TOPICS = topics_pb2.DESCRIPTOR.services_by_name["Topics"]

CREATE_STREAM = _forward(_STREAMS, "CreateStream", types_pb2.StreamInfo)
UPDATE_STREAM = _forward(_STREAMS, "UpdateStream", streams_pb2.UpdateStreamResponse)
DELETE_STREAM = _forward(_STREAMS, "DeleteStream", streams_pb2.DeleteStreamResponse)
GET_STREAM_INFO = _forward(_STREAMS, "GetStreamInfo", types_pb2.StreamInfo)
LIST_STREAMS = _forward(_STREAMS, "ListStreams", streams_pb2.ListStreamsResponse)
PURGE_STREAM = _forward(_STREAMS, "PurgeStream", streams_pb2.PurgeStreamResponse)
GET_MESSAGE = _forward(_STREAMS, "GetMessage", types_pb2.Message)
READ_LATEST = _forward(_STREAMS, "ReadLatestAtSubject", types_pb2.Message)
LIST_SUBJECTS = _forward(_STREAMS, "ListSubjectsByPrefix",
                         streams_pb2.ListSubjectsByPrefixResponse)
SCAN_SUBJECT = _forward(_STREAMS, "ScanExactAtSubject", streams_pb2.ScanExactAtSubjectResponse)
PUBLISH = _forward(_STREAMS, "Publish", streams_pb2.PublishAck)
PUBLISH_BATCH = _forward(_STREAMS, "PublishBatch", streams_pb2.PublishBatchResponse)
PUBLISH_STREAM = _forward(_STREAMS, "PublishStream", streams_pb2.PublishBatchResponse)
READ_MESSAGES = _forward(_STREAMS, "ReadMessages", streams_pb2.ReadMessagesResponse)
GET_STREAM_SOURCES = _forward(_STREAMS, "GetStreamSources", streams_pb2.GetStreamSourcesResponse)

CREATE_CONSUMER = _forward(_CONSUMERS, "CreateConsumer", consumers_pb2.ConsumerInfo)
DELETE_CONSUMER = _forward(_CONSUMERS, "DeleteConsumer", consumers_pb2.DeleteConsumerResponse)
LIST_CONSUMERS = _forward(_CONSUMERS, "ListConsumers", consumers_pb2.ListConsumersResponse)
GET_CONSUMER_INFO = _forward(_CONSUMERS, "GetConsumerInfo", consumers_pb2.ConsumerInfo)
FETCH = _forward(_CONSUMERS, "Fetch", consumers_pb2.FetchResponse)
ACK = _forward(_CONSUMERS, "Ack", consumers_pb2.AckResponse)
NAK = _forward(_CONSUMERS, "Nak", consumers_pb2.AckResponse)
TERM = _forward(_CONSUMERS, "Term", consumers_pb2.AckResponse)
IN_PROGRESS = _forward(_CONSUMERS, "InProgress", consumers_pb2.AckResponse)
SUBSCRIBE = _forward(_CONSUMERS, "Subscribe", consumers_pb2.SubscribeEvent)

JOIN_NODE = _forward(_CLUSTER, "JoinNode", cluster_pb2.ClusterStatus)
LEAVE_NODE = _forward(_CLUSTER, "LeaveNode", cluster_pb2.ClusterStatus)
MIGRATE_STREAM = _forward(_CLUSTER, "MigrateStream", cluster_pb2.MigrateStreamResponse)
REBALANCE_STREAMS = _forward(_CLUSTER, "RebalanceStreams", cluster_pb2.RebalanceStreamsResponse)
SET_CONSUMER_STATE = _forward(_CLUSTER, "SetConsumerState",
                              cluster_pb2.SetConsumerStateResponse)
# One partition's group offsets, sent to that partition's primary (ops/partitions.py).
SET_TOPIC_OFFSETS = _forward(_TOPICS, "SetTopicOffsets", topics_pb2.TopicOffsets)
