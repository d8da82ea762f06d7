"""Every limit of a node, with its unit last. Documented in docs/limits.md."""

from __future__ import annotations

# Names.
name_bytes_max = 128
subject_bytes_max = 256
subject_tokens_max = 32
description_bytes_max = 1024

# Messages.
message_bytes_max = 1024 * 1024  # payload + headers + subject
headers_count_max = 64
header_bytes_max = 8 * 1024  # one header, key + value
msg_id_bytes_max = 256

# Requests.
request_bytes_max = 16 * 1024 * 1024  # gRPC receive limit of a node
batch_messages_max = 10_000  # entries of one PublishBatch
stream_publish_inflight_max = 1_000  # PublishStream entries awaiting durability per call
stream_publish_chunk_max = 256  # PublishStream entries of one stream staged together
fetch_batch_max = 10_000
fetch_wait_ms_max = 60_000
fetch_bytes_max = 8 * 1024 * 1024  # payload bytes in one FetchResponse
ack_seqs_max = 10_000  # seqs in one Ack/Nak/Term/InProgress
list_subjects_limit_default = 1_000
list_subjects_limit_max = 100_000
scan_limit_default = 1_000
scan_limit_max = 10_000

# Streams and consumers.
streams_max = 10_000  # per node
consumers_per_stream_max = 1_000
subjects_per_stream_max = 256  # subject patterns in a stream config
dedupe_window_ms_default = 2 * 60 * 1000
dedupe_window_ms_max = 24 * 60 * 60 * 1000
dedupe_entries_max = 1_000_000  # per stream; the oldest entries go first
ack_wait_ms_default = 30_000
ack_wait_ms_max = 24 * 60 * 60 * 1000
max_ack_pending_default = 1_000
max_ack_pending_max = 100_000
backoff_steps_max = 32
nak_delay_ms_max = 24 * 60 * 60 * 1000
replicas_default = 3
replicas_max = 5

# Storage.
group_commit_batch_max = 10_000  # publishes whose WriteBatches one fsync covers at most
retention_sweep_period_ms = 1_000  # max-age sweep
retention_sweep_deletes_max = 10_000  # messages one sweep step removes per stream

# Subscribe.
subscribe_batch_default = 64
subscribe_heartbeat_ms_default = 5_000

# Shutdown.
drain_grace_s = 2.0

# Consumers (appended).
acked_above_floor_max = 100_000  # acked seqs above a consumer's ack floor; new deliveries pause
subscribe_heartbeat_ms_min = 100  # a shorter heartbeat would make an idle Subscribe spin

# Bad input and resource bounds (appended).
subscriptions_max = 1_000  # Subscribe calls a node holds open at once (a relayed one counts here)
subscribe_buffer_bytes_max = 64 * 1024  # message bytes a Subscribe fetches ahead of the client
log_repeats_max = 10  # log records per logger and message template per log_repeat_window_s
log_repeat_window_s = 60  # beyond log_repeats_max, records are counted, then summarised
log_templates_max = 1_000  # (logger, template) pairs the log limiter tracks; the oldest goes
