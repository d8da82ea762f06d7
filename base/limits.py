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

# Forwarding (any node serves any call: transport/forwarding.py sends it where it is served).
forward_hops_max = 3  # a call forwarded more often than this is refused (HOP_LIMIT)
forward_timeout_s_default = 30.0  # a forwarded call's deadline when the caller set none
forward_check_s = 0.1  # a forwarded call checks this often that the node serving it still answers
fanout_timeout_s = 5.0  # one node's answer to a cluster-wide list call
channels_max = 64  # pooled channels to other nodes; the least recently used is closed beyond
reconnect_backoff_ms = 100  # a pooled channel to a restarted node reconnects after this...
reconnect_backoff_ms_max = 1_000  # ...growing to at most this

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
trouble_scan_period_s = 0.5  # how often the local copies are checked against the metadata
trouble_grace_s = 0.5  # a trouble is reported once it has lasted this long

# Consumer state through the metadata group (consumers/raft_store.py) and delivery
# (consumers/delivery.py).
consumer_save_coalesce_ms = 2.0  # saves arriving this long after the first pending one share
# its command
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
malformed_error_chars_max = 200  # of the parser's message, in the reply and the log line

# Process (node/server.py).
gil_switch_interval_s = 0.0002  # GIL hand-off; threads back from an fsync wait at most this
# (DESIGN §3)
