"""Every limit of a node, with its unit last. Documented in docs/limits.md."""

from __future__ import annotations

# Names.
name_bytes_max = 128
topic_partitions_max = 1_000  # partitions of one topic (index 0..999 in its streams' names)
topic_name_bytes_max = (name_bytes_max - 11) // 2  # worst case doubles; TOPIC_ + _p999 = 11
topic_cache_ms = 1_000  # a node trusts a topic's partition count it read this long
topics_cached_max = 10_000  # partition counts a node remembers; beyond it they are forgotten
topic_fanout_max = 16  # per-partition calls one topic call has in flight
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
publish_frames_inflight_max = 16  # PublishFrames frames of one call read and not yet answered
fetch_batch_max = 10_000
fetch_wait_ms_max = 60_000
fetch_bytes_max = 8 * 1024 * 1024  # payload bytes in one FetchResponse
ack_seqs_max = 10_000  # seqs in one Ack/Nak/Term/InProgress
list_subjects_limit_default = 1_000
list_subjects_limit_max = 100_000
scan_limit_default = 1_000
scan_limit_max = 10_000
scan_examined_max = 100_000  # messages one wildcard-filtered read (a consumer's fetch) looks at
# before it stops (engine/stream_reads.py)

# Streams and consumers.
streams_per_node_max = 10_000  # streams one node holds a copy of (engine/streams.py; the
# cluster's cap is raft/state_model.py cluster_streams_max, a rule of the replicated state machine)
consumers_per_stream_max = 1_000
subjects_per_stream_max = 256  # subject patterns in a stream config
dedupe_window_ms_default = 2 * 60 * 1000
dedupe_window_ms_max = 24 * 60 * 60 * 1000
max_age_ms_max = 100 * 365 * 24 * 60 * 60 * 1000  # a stream's max_age_ms: a century
dedupe_entries_max = 1_000_000  # per stream; the oldest entries go first
ack_wait_ms_default = 30_000
ack_wait_ms_max = 24 * 60 * 60 * 1000
max_ack_pending_default = 1_000
max_ack_pending_max = 100_000
backoff_steps_max = 32
nak_delay_ms_max = 24 * 60 * 60 * 1000
replicas_default = 3
replicas_max = 5
list_barrier_wait_s_max = 2.0  # a listing first reads the metadata at the leader's commit, at most
stream_ready_wait_s_max = 5.0  # a create waits this long at most for the new primary's lease
stream_ready_poll_ms = 20  # how often it looks meanwhile
stream_ready_reserve_ms = 200  # of the call's deadline, kept for the answer
insufficient_replicas_retry_after_ms = 1_000  # a create short of members: nodes may join

# Storage.
group_commit_batch_max = 10_000  # publishes whose WriteBatches one fsync covers at most
retention_sweep_period_ms = 1_000  # max-age sweep
retention_sweep_deletes_max = 10_000  # messages one sweep step removes per stream
fsync_wait_s_max = 30.0  # a stopping node waits this long for its last fsync (engine/storage.py)

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
request_id_bytes_max = 64  # a caller's raftlog-request-id longer than this is replaced

# Forwarding (any node serves any call: transport/forwarding.py sends it where it is served).
forward_hops_max = 3  # a call forwarded more often than this is refused (HOP_LIMIT)
forward_timeout_s_default = 30.0  # a forwarded call's deadline when the caller set none
forward_check_s = 0.1  # a forwarded call checks this often that the node serving it still answers
fanout_timeout_s = 5.0  # one node's answer to a cluster-wide list call
channels_max = 64  # pooled channels to other nodes; the least recently used leaves the pool beyond
reconnect_backoff_ms = 100  # a pooled channel to a restarted node reconnects after this...
reconnect_backoff_ms_max = 1_000  # ...growing to at most this
# for the channel to be ready, then is sent once more

# Metadata group (raft/group.py, journal.py, api.py: how this node drives its Raft group; the
# caps the replicated state machine enforces are rules of the protocol and stay in
# raft/state_model.py).
metadata_command_bytes_max = 48 * 1024  # one encoded metadata command; well under pysyncobj's
# 64 KiB append batch (larger entries go in chunks followers mishandle, DEPENDENCIES.md §1.11)
raft_membership_retries_max = 40  # REQUEST_DENIED retries of one Raft membership change
raft_membership_retry_delay_s = 0.05  # between those retries
raft_membership_poll_s = 0.01  # while waiting for a membership change to be appended
raft_close_timeout_s = 5.0  # closing the group waits this long for its tick thread to stop
raft_close_poll_s = 0.01  # ...checking this often
raft_status_read_attempts_max = 5  # reads of pysyncobj's sets racing the tick thread
raft_truncated_memory_entries_max = 100_000  # truncated journal entries remembered to tell
# identical re-adds from conflicting ones; beyond it the memory is cleared

# Elections (raft/elections.py: pre-vote, leader stickiness, timeouts that follow the measured
# scheduling delay of the tick thread).
election_delay_factor = 4.0  # election timeouts are at least this x the worst recent tick gap
election_delay_window_s = 30.0  # tick gaps are remembered this long
adaptive_election_timeout_s_max = 3.0  # the adaptive minimum election timeout never exceeds
# this (the configured random spread comes on top)
adaptive_leader_fallback_timeout_s_max = 3.0  # nor does the adaptive leader fallback timeout
prevote_retry_s = 0.05  # a follower whose election timer ran out asks for pre-votes this often
prevote_grant_s = 0.1  # a granted pre-vote lets the election start within this

# Cluster metadata (cluster/coordinator.py: this node's use of the metadata group, reconciling its
# copies with what Raft committed, watchers, and the troubles it reports).
metadata_propose_timeout_s = 5.0  # a metadata command, when the caller set no shorter deadline
no_leader_wait_s = 0.5  # a metadata call waits this long for a leader, then NO_LEADER
catching_up_retry_after_ms = 250  # the retry_after_ms a CATCHING_UP answer suggests
# (cluster/existence.py)
register_retry_s = 0.2  # between attempts to register this node, and to reconcile a stream again
metadata_catch_up_attempt_s = 2.0  # one attempt to commit the start-up Barrier
metadata_ready_poll_s = 0.05  # between those attempts; a call waiting for a leader polls 5x as
# often
reconcile_queue_max = 100_000  # streams waiting to be reconciled (each is queued once)
watch_queue_max = 10_000  # events buffered per watcher; a slower watcher is dropped
raft_leaderless_warn_s = 5.0  # a node without a metadata leader says so this often, with why
trouble_scan_period_s = 0.5  # how often the local copies are checked against the metadata
trouble_grace_s = 0.5  # a trouble is reported once it has lasted this long

# Consumer state through the metadata group (consumers/raft_store.py) and delivery
# (consumers/delivery.py).
consumer_save_coalesce_ms = 0.0  # saves arriving this long after the first pending one share
# its command; 0 = those of the same event-loop turn, and those arriving while a batch is in
# flight (one at a time), share the next
consumer_saves_inflight_max = 4  # saves of one consumer in flight at once; later acks join the
# next to start
consumer_save_gather_ms = 7.0  # a save of a consumer that already has one in flight starts this
# long after the first ack it covers arrived, so the acks of a busy consumer share Raft entries;
# a consumer with none in flight saves at once
consumer_batches_inflight_max = 4  # batches of saves a node's consumer store proposes at once
consumer_propose_timeout_s = 5.0  # given to the metadata group's propose for each command
consumer_propose_grace_s = 1.0  # past consumer_propose_timeout_s, stop waiting for a group that
# did not answer
consumer_pending_saves_max = 10_000  # saves waiting for a commit (pending and in flight), in all
consumer_command_headroom_bytes = 64  # RaftCommand framing around the updates of one command
consumer_redeliveries_on_load_max = max_ack_pending_max + acked_above_floor_max  # unacked seqs
# above the ack floor a new primary turns into pending deliveries, per consumer: the most a
# consumer can have handed out unacked, plus as many skipped seqs (filter, holes) again
redelivery_wait_s_min = 0.001  # the shortest wait for a redelivery deadline (never a busy loop)

# Publishing (engine/stream_publish.py: the checks and the wait for a commit).
known_subjects_max = 10_000  # validated subjects remembered per stream; beyond it they are
# forgotten and checked again
publish_commit_wait_s_max = 10.0  # a publish waits this long for a majority, then NO_QUORUM
publish_commit_check_s = 0.1  # a waiting publish checks this often that a majority still answers

# Replication (replication/primary.py: links, batches and the read lease; replication/service.py:
# the replica's side; engine/replica_batch.py, stream_replica.py, stream_core.py: the bounds of
# every batch, which the primary keeps when it builds one).
primary_lease_s = 0.5  # a primary serves reads and writes while a majority of its replica set
# acknowledged a request sent this recently; failover_after_s must exceed it
replication_heartbeat_s = 0.05  # an idle link carries a heartbeat this often
replication_request_timeout_s = 2.0  # a request not acknowledged by then restarts the link
replication_reconnect_backoff_s = 0.1  # between attempts to reopen a link
replication_refused_retry_s = 0.1  # a replica that refused a batch (other than a gap) is asked
# again after this
replication_batch_bytes_max = 1024 * 1024  # stored bytes in one batch (at least one message)
replication_batch_messages_max = 10_000  # messages in one batch; a replica refuses more
replication_inflight_max = 4  # batches sent to one replica and not yet acknowledged
replication_link_queue_max = 10_000  # requests waiting on one link; streams wait beyond it
replication_wakes_per_tick_max = 2_000  # waiting streams one link wakes per tick once it has room
heartbeat_commits_sent_max = 5_000  # commit notices one heartbeat carries (the rest: the next)
heartbeat_commits_applied_max = 10_000  # commit notices a replica applies from one heartbeat
replication_seq_max = 2**53  # a seq or epoch in a batch above this is refused
replication_removed_seqs_max = 10_000  # seqs the removed ranges of one batch cover
replication_removed_ranges_max = 10_000  # removed ranges in one batch
replication_history_entries_max = 64  # (epoch, start seq) pairs one batch carries (the
# metadata keeps raft/state_model.py epoch_history_max = 64 per stream)
removed_log_max = 100_000  # removals a primary keeps to pass on to its replicas; later ones
# are not passed on (a replica still drops what falls below the head, and all on a re-seed)
head_removals_max = 10_000  # messages a replica removes below a moved head per batch
replicate_group_requests_max = 64  # batches of one Replicate call that share an fsync
replicate_requests_waiting_max = 256  # batches read ahead of the one being applied
survey_streams_max = 10_000  # streams one failover Survey call names
read_local_limit_max = 10_000  # messages in one ReadLocal reply
read_local_bytes_max = 8 * 1024 * 1024  # stored bytes in one ReadLocal reply (at least one
# message; the peer listener sends at most request_bytes_max)
ping_nonce_bytes_max = 64  # of a Ping's challenge that is signed

# Liveness (cluster/liveness.py: who is alive, judged from the path that serves requests).
loop_beat_period_s = 0.02  # the event loop notes this often that it runs
liveness_ping_period_s = 0.1  # each node pings every other member this often
liveness_ping_timeout_s = 1.0  # a slow answer still counts: silence is measured, not timeouts
failover_after_s = 0.8  # silence before a primary is replaced; must exceed the read lease
failover_after_s_max = 3.0  # the adaptive failover threshold never goes above this
unreachable_after_s = 0.5  # forwarding to a member silent this long fails fast (the lease)
unreachable_retry_after_ms = 250  # the retry_after_ms such a failure suggests (cluster/
# coordinator.py)
liveness_delay_factor = 3.0  # thresholds are at least this x the worst recent scheduling delay
liveness_delay_window_s = 30.0  # scheduling delays are remembered this long
liveness_view_fresh_s = 1.0  # a member's report of its silences counts for this long
liveness_report_silence_ms_min = 100  # members silent for less are not reported in a Ping reply
liveness_trouble_fresh_s = 1.0  # a member's report of its stream troubles counts for this long

# Failover (cluster/failover.py: the Raft leader replaces lost or troubled primaries).
failover_check_period_s = 0.05  # the leader looks for streams to fail over this often
failover_survey_timeout_s = 0.5  # one replica node's answer to a failover Survey
failover_retry_s = 0.5  # between rounds that include one stream
failover_promote_timeout_s = 2.0  # one StreamPromotes entry must commit within this
failover_round_streams_max = 5_000  # streams one round handles; the rest wait for the next
failover_promote_batch_bytes_max = metadata_command_bytes_max - 4096  # encoded promotes in one
# Raft entry

# Placement (cluster/placement.py: migrations, drains, the janitor; cluster/ring.py).
placement_catch_up_timeout_s = 30.0  # a move's target must hold the committed prefix within this
placement_catch_up_poll_s = 0.02  # how often a move asks the target how far it is
move_target_silent_s_max = 3.0  # a move ends when its target has answered nothing for this long
move_handover_catch_up_s = 5.0  # after the old primary stops writing, for the target's last seqs
migrate_attempts_max = 3  # attempts of one move before it fails
move_settle_timeout_s = 5.0  # after a move, for the set to shrink back (else the janitor does it)
placement_step_timeout_s = 10.0  # one replica-set change of a move or a drain waits this long
# to be safe
placement_step_poll_s = 0.05  # between tries of such a change
placement_survey_timeout_s = 0.5  # one copy's answer about its position
placement_propose_timeout_s = 5.0  # one placement command must commit within this
janitor_period_s = 1.0  # the Raft leader's janitor runs this often
janitor_streams_per_pass_max = 64  # replica-set changes one janitor pass makes at most
janitor_concurrency_max = 16  # streams one janitor pass asks about at once
replace_dead_after_s_default = 30.0  # a replica on a member silent this long is replaced
ring_vnodes_per_member = 256  # tokens per member on the ring (changing it moves streams; see
# cluster/ring.py for the measurements)
ring_token_bytes = 8  # bytes of a BLAKE2b digest used as a ring token: a 64-bit circle

# Membership (ops/membership.py: join, leave, migrate, rebalance; ops/route.py).
membership_change_timeout_s = 10.0  # one Raft membership change (add, remove, hand leadership over)
join_probe_timeout_s = 2.0  # a joining node must answer its challenge within this
join_catch_up_s = 30.0  # ...and apply the metadata up to its own registration within this
join_poll_s = 0.1  # how often the leader asks the joining node how far it is
rebalance_steps_max = 1_000  # steps in one RebalanceStreams plan
no_leader_retry_after_ms = 250  # the retry_after_ms a NO_LEADER error suggests

# Node-to-node calls (transport/peer.py, credentials.py) and bad input (transport/malformed.py).
peer_keepalive_time_ms = 1_000  # a peer channel pings an idle connection this often...
peer_keepalive_timeout_ms = 1_000  # ...and drops it when the ping is not answered within this
peer_reconnect_backoff_ms_max = 200  # a peer that refused (e.g. still starting) is tried this often
secret_entropy_bits_min = 256  # the cluster secret's estimated entropy (32 random bytes)
secret_bytes_max = 4096  # the cluster secret's length
call_token_skew_ms_max = 60_000  # a call token this far from the receiver's clock is refused
call_token_bytes_max = 512  # a longer call token is refused unread
user_token_bytes = 32  # random bytes in a user's bearer token (docs/auth.md)
malformed_error_chars_max = 200  # of the parser's message, in the reply and the log line

# Process (node/server.py).
gil_switch_interval_s = 0.0002  # GIL hand-off; threads back from an fsync wait at most this
# (DESIGN §3)
# The cyclic garbage collector (node/server.py: `run` sets these; `serve` freezes what the start
# built, which then stays out of every collection). With CPython's defaults (700, 10, 10) a node
# under load spent ~2% of its time in it, a full collection taking 30-50 ms of the event loop;
# with these, a third of that, and no full collection in a 25 s load.
gc_young_objects = 5_000  # allocations (net) between collections of the youngest generation
gc_middle_collections = 20  # youngest-generation collections between middle-generation ones
gc_old_collections = 50  # middle-generation collections between full ones

# Audit export (ops/audit_export.py: Cluster.ExportAudit; the exporter runs as a child process).
audit_export_s_max = 900.0  # an online export (checkpoint, export, the reply) ends with TIMEOUT
# after this
audit_export_chunk_bytes_max = 1024 * 1024  # file bytes in one ExportAuditChunk
audit_export_stderr_bytes_max = 4_096  # of the exporter's stderr, kept for the error it reports
audit_export_stop_s = 5.0  # a stopped exporter (killed) is waited for this long

# Object store (ops/objects.py, ops/objects_layout.py: buckets of objects kept as chunk
# messages plus a metadata message on one stream per bucket).
object_bucket_name_bytes_max = 48  # a bucket name; its stream is OBJ_<bucket>
object_name_token_bytes_max = 192  # an object name once encoded into a subject token (bytes
# outside [A-Za-z0-9_-/=:@+,~] take 3 each)
object_chunk_bytes_default = 512 * 1024  # the chunk size of a put that names none
object_chunk_bytes_max = message_bytes_max - subject_bytes_max  # one chunk is one message
object_unary_bytes_max = request_bytes_max - 1024 * 1024  # object bytes in one unary Get or
# GetRange reply (the rest of the reply, info and headers, fits the remaining MiB)
object_put_inflight_max = 8  # chunk publishes of one put awaiting durability
object_first_batch_chunks_max = 4  # chunks published in one batch with an upload's marker
object_get_prefetch_max = 4  # chunk reads of one get ahead of the one being sent
object_list_limit_default = 1_000  # objects in one List reply
object_list_limit_max = 10_000
object_list_reads_max = 16  # metadata reads one List makes at once
object_revisions_limit_default = 100  # revisions in one ListRevisions reply
object_revisions_limit_max = 1_000
object_marker_refresh_s = 20.0  # an upload re-publishes its marker when it is this old
object_upload_idle_s = 120.0  # an upload marker this old (not the live revision) is collected
object_sweep_period_s = 30.0  # how often a bucket's primary looks for abandoned uploads
object_sweep_markers_max = 1_000  # upload markers one sweep of one bucket examines
object_cleanup_attempts_max = 5  # purges of a failed put's chunks before the sweep's turn
object_cleanup_backoff_s = 0.2  # the pause after the first retryable failure; doubles
object_cleanup_backoff_max_s = 2.0  # ...up to this
object_retry_attempts_max = 15  # tries of one object publish or chunk read refused UNAVAILABLE
object_retry_backoff_s = 0.05  # the pause after the first such refusal; doubles...
object_retry_backoff_max_s = 1.0  # ...up to this (15 attempts: 10.55 s of pauses)

# KV buckets (ops/kv.py, kv_entries.py, kv_watch.py: buckets of keys on one stream per bucket).
kv_history_max = 64  # revisions a bucket keeps per key (its stream's max_msgs_per_subject)
kv_bucket_name_bytes_max = name_bytes_max - 3  # a bucket name; its stream is KV_<bucket>
kv_entry_overhead_bytes = 512  # a KV message's subject and headers at most: a bucket's stream
# takes messages of max_value_size + this (the value itself is checked against max_value_size)
kv_value_bytes_max = message_bytes_max - kv_entry_overhead_bytes  # the largest value
kv_ttl_ms_max = max_age_ms_max  # a key's TTL
kv_bucket_cache_ms = 1_000  # a node trusts a bucket's settings it read this long (value size)
kv_buckets_cached_max = 10_000  # bucket settings a node remembers; beyond it they are forgotten
kv_write_attempts_max = 3  # a Create or Touch that lost a race to another write reads again
kv_reads_parallel_max = 32  # entry reads one Keys call or watch start makes at once
kv_watches_max = 1_000  # Watch calls a node serves at once
kv_watch_batch_max = 256  # revisions a watch reads before it sends them
kv_watch_wait_ms = 1_000  # one read of a watch waits this long for a commit, then reads again
kv_watch_retry_pause_ms_min = 10  # a watch whose read was UNAVAILABLE reads again after this...
kv_watch_retry_pause_ms_max = 200  # ...doubling up to this
kv_watch_retry_s_max = 30.0  # a watch retries a bucket that is UNAVAILABLE (failover) this long

# Stream sources (ops/sources.py, ops/source_tail.py: tails copying from other streams).
sources_per_stream_max = 16  # sources one stream may copy from
source_read_batch_max = 128  # source messages one tail round reads (ReadMessages' default)
source_read_bytes_max = 3 * 1024 * 1024  # message bytes one ReadMessages reply carries (at
# least one message); with one more message and the framing a reply stays under a default gRPC
# client's 4 MiB receive limit
source_read_examined_max = 10_000  # messages one ReadMessages call looks at (filtered out
# or not) before it answers with what it found
source_read_wait_ms = 1_000  # a caught-up tail's read waits this long for new source messages
source_retry_ms = 250  # a tail whose round failed (source missing, failover) tries again after
source_retry_ms_max = 2_000  # ...doubling while its rounds keep failing, up to this
source_reconcile_period_ms = 500  # how often a node starts and stops tails for what it leads
source_position_scan_max = 1_000_000  # sourcing-stream messages a starting tail reads back
# looking for its last copied message
source_position_page = 1_000  # messages of that scan read between two yields of the loop
source_error_chars_max = 500  # a tail's last_error (and a dead-letter record's error text)

# The Waymaker API (node/api/waymaker.py; docs/waymaker.md).
waymaker_max_deliver_default = 5  # a Waymaker consumer's max_deliver when given as 0
waymaker_subscribe_batch_default = 16  # messages per server-side fetch of a Waymaker Subscribe
waymaker_transfer_chunk_bytes_max = 1024 * 1024  # data bytes in one TransferStreamChunk
waymaker_rebalance_step_timeout_ms_default = 30_000  # one RebalanceStreams step, when 0
waymaker_watch_buffer_max = 1_000  # WatchStreams events held for a slow watcher (then lagged)
waymaker_settle_wait_ms = 5_000  # MigrateStream waits this long for the moved stream's info
waymaker_settle_poll_ms = 50  # and asks again this often

# Collections (ops/collections.py, collection_layout.py: hashes, sets and queues, one stream each).
collection_name_bytes_max = name_bytes_max - 6  # a collection name (its stream: QUEUE_<name>)
collection_key_bytes_max = 60  # a hash or set key (its subject token is 4/3 as long)
collection_field_bytes_max = 120  # a hash field or a set member
collection_list_limit_default = 1_000  # fields or members one GetHash, ListHashFields or
# ListSetMembers answers with
collection_list_limit_max = 10_000
collection_subjects_page_max = 10_000  # subjects one listing asks the stream for; a key with
# more is listed by narrower prefixes
collection_reads_parallel_max = 32  # value reads one GetHash makes at once
collection_write_attempts_max = 16  # a write whose expected seq moved (a race) reads again
collection_retry_backoff_ms_max = 50  # the pause before such a retry is random, at most this
collection_ready_wait_s_max = 5.0  # a create waits this long at most for its new stream to
# serve reads (its primary's first lease) before it answers
collection_ready_poll_ms = 20  # how often it looks meanwhile
queue_pop_ack_wait_ms = 5_000  # a value handed to a pop that died before its ack is handed
# out again after this
queue_pop_attempts_max = 16  # a pop whose value another pop settled first fetches again
queue_peek_limit_default = 100
queue_peek_limit_max = scan_limit_max

# The Numaflow source sidecar (node/cli/numaflow_source.py; docs/numaflow.md).
numaflow_message_bytes_max = 64 * 1024 * 1024  # gRPC messages on its socket and to the cluster
# (what numa and pynumaflow use)
numaflow_call_timeout_ms = 10_000  # one Ack, Nak or consumer-info call to a node
numaflow_call_retry_ms_max = 30_000  # an ack keeps trying other nodes this long, then the
# AckFn stream fails with UNAVAILABLE (numa reconnects and acks again)
numaflow_retry_pause_ms = 100  # pause before trying the next node
numaflow_call_slack_ms = 2_000  # a Fetch's deadline is its wait plus this
numaflow_pending_retry_ms_max = 2_000  # PendingFn answers -1 (unknown) after this
numaflow_ready_check_ms = 1_000  # IsReady's health check of one node
numaflow_shutdown_grace_ms = 2_000  # calls in flight get this long when the sidecar stops
numaflow_poll_slice_ms = 200  # with --topic, an idle read waits on all its partitions at
# once this long at a time (a record found in one is answered at most this late)

# The Kafka-Pixy front-end (node/api/kafkapixy.py, ops/kafkapixy_groups.py; docs/kafkapixy.md).
kafkapixy_long_poll_ms = 3_000  # ConsumeNAck waits this long for a message, then NOT_FOUND
kafkapixy_poll_slice_ms = 250  # a waiting ConsumeNAck waits on one partition this long at a time
kafkapixy_deadline_margin_ms = 200  # a long poll answers NOT_FOUND this long before the
# caller's deadline
kafkapixy_ack_wait_ms = 300_000  # a new group's ack timeout: unacked messages come again after it
kafkapixy_pending_max = 300  # a new group's unacked messages per partition (max_ack_pending)
kafkapixy_waiting_max = 64  # ConsumeNAck calls of one group and topic waiting on one node
kafkapixy_async_writes_max = 10_000  # async_mode produces one node has in flight
kafkapixy_groups_cached_max = 10_000  # (topic, group) pairs a node remembers as existing

# The RocketMQ v2 front-end (node/api/rocketmq_v2.py, ops/rocketmq.py; docs/rocketmq.md).
rocketmq_invisible_ms_default = 30_000  # a receive that names no invisible duration
rocketmq_invisible_ms_max = 12 * 3600 * 1000  # a longer invisible duration: ILLEGAL_INVISIBLE_TIME
rocketmq_long_poll_ms_max = 30_000  # a receive waits at most this long for a first message
rocketmq_poll_reserve_ms = 500  # a long poll ends this long before the caller's deadline
rocketmq_batch_max = 32  # messages one receive returns at most
rocketmq_ack_pending_max = 1_000  # a new group's unacked messages per queue (max_ack_pending)
rocketmq_groups_cached_max = 10_000  # (topic, group) pairs a node remembers as existing
rocketmq_attempts_default = 16  # deliveries a group allows before its dead-letter topic
rocketmq_txn_timeout_ms = 120_000  # a RocketMQ transaction never ended is rolled back after this
rocketmq_txn_check_after_ms = 5_000  # an open transaction this old is put to its producer
rocketmq_txn_check_period_ms = 5_000  # how often a producer's telemetry stream asks about them
rocketmq_seconds_max = 100_000_000_000  # delivery_timestamp seconds above this are read as ms
rocketmq_max_body_bytes = 4 * 1024 * 1024  # the body limit the server gives producers
# The send retry policy the server gives producers (RocketMQ's proxy defaults; each client
# keeps its own attempt count and takes the back-off).
rocketmq_send_attempts_max = 3
rocketmq_send_backoff_initial_ms = 10
rocketmq_send_backoff_max_ms = 1_000
rocketmq_send_backoff_multiplier = 2

# The RocketMQ v1 front-end (node/api/rocketmq_v1.py, ops/rocketmq_receive.py, ops/rocketmq_dlq.py;
# docs/rocketmq-v1.md). It also uses the rocketmq_* limits above. The first two below are the POP
# receive's (ops/rocketmq_receive.py), which the v2 front-end uses too.
rocketmq_poll_slice_ms = 250  # a receive of any queue waits on one queue this long at a time
rocketmq_receives_waiting_max = 64  # receives of one group and topic in progress on one node
rocketmq_v1_command_poll_ms = 20_000  # PollCommand holds this long at most, then answers Noop
rocketmq_v1_clients_max = 10_000  # clients (with their heartbeat data) one node remembers
rocketmq_v1_txns_max = 10_000  # transactions whose recovery period / last question a node keeps

# Transactions: two-phase publishes (node/ops/transactions*.py; docs/transactions.md).
txn_timeout_ms_default = 60_000  # a prepare that names no timeout is rolled back after this
txn_timeout_ms_max = 3_600_000  # the longest timeout a prepare may ask
txn_record_age_ms = 2 * txn_timeout_ms_max  # the half stream's max_age: decisions (and a
# prepare the janitor never reached) are forgotten after this
txn_checks_max = 15  # a transaction whose producer was asked this often is rolled back
txn_janitor_period_ms = 1_000  # how often the janitor looks at the half streams it leads
txn_janitor_batch_max = 1_000  # open transactions one janitor round looks at per half stream
txn_list_limit_default = 1_000  # ListTransactions and orphans() answer at most this many
txn_list_limit_max = 10_000
txn_land_scan_max = 10_000  # a commit finishing another's decision reads back this many target
# messages at the subject for a copy already appended
txn_ready_wait_s_max = 5.0  # a prepare waits this long at most for a new half stream to serve
txn_ready_poll_ms = 20  # how often it tries meanwhile
txn_checks_tracked_max = 100_000  # check counts one node keeps; beyond it they start again
txn_floors_max = 10_000  # half streams whose oldest prepared seq one node remembers

# Scheduled (delayed) messages (node/ops/schedule*.py; docs/scheduled.md).
scheduled_delay_ms_max = 40 * 24 * 3600 * 1000  # deliver_at_ms further ahead: INVALID_ARGUMENT
scheduled_poll_ms = 200  # how often a scheduler looks for newly scheduled messages
scheduled_deliver_batch_max = 128  # due messages one scheduler round delivers
scheduled_deliver_bytes_max = 3 * 1024 * 1024  # ...and their bytes (one at least)
scheduled_retry_ms = 250  # a delivery that failed (target failing over) is tried again after
scheduled_retry_ms_max = 5_000  # ...doubling while it keeps failing, up to this
scheduled_reconcile_period_ms = 500  # how often a node starts and stops its schedulers
scheduled_scan_page = 1_000  # schedule messages a rebuilding scheduler reads between yields
scheduled_list_limit_default = 100  # ListScheduled with no limit
scheduled_list_limit_max = 1_000
scheduled_takeover_scan_max = 10_000  # target messages a new scheduler reads back for copies
# whose removal from the schedule was lost in a failover
scheduled_clock_skew_ms_max = 5_000  # nodes' wall clocks may differ by this much
scheduled_cancel_wait_ms_max = 5_000  # a cancel waits this long for a delivery in flight

# TLS (node/transport/tls.py, node/cli/certs.py; docs/tls.md).
tls_local_cert_valid_s = 7 * 24 * 3600  # certificates `raftlog cluster up --tls` makes
tls_local_ca_valid_s = 30 * 24 * 3600  # ...and their CA (a new one when it would expire first)

# Metrics (node/transport/metrics*.py; docs/metrics.md).
metrics_snapshot_timeout_s = 2.0  # a scrape waits this long for the event loop to copy its state

# Quotas (node/ops/quotas.py, node/transport/connections.py; docs/quotas.md).
quota_burst_s = 1.0  # a quota's token bucket holds this many seconds of its rate
quota_keys_max = 10_000  # quota buckets one node keeps; the least recently used is forgotten
quota_msgs_per_s_max = 10_000_000  # the largest max_msgs_per_s a stream may set
quota_bytes_per_s_max = 1 << 40  # the largest max_bytes_per_s a stream may set
client_connections_max_default = 0  # clients with calls open at once on a node; 0 = no limit
connections_retry_after_ms = 1_000  # the retry hint of TOO_MANY_CONNECTIONS
subscriptions_retry_after_ms = 1_000  # the retry hint of TOO_MANY_SUBSCRIPTIONS
stream_full_retry_after_ms = 1_000  # the retry hint of STREAM_FULL (a DISCARD_NEW stream, full)
stream_split_messages_max = 1_000  # PublishStream messages a cluster node gathers per destination
stream_split_bytes_max = 4 * 1024 * 1024  # ...or bytes, before it sends them on and reads further
