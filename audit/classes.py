"""The divergence classes: names, what each means, and the order reports list them in.

A record class (HOLE .. EPOCH) is decided per (stream, seq, node) against the authoritative
record and reported as runs of consecutive seqs; the others are decided per stream copy,
per metadata view or per consumer copy.
"""

from __future__ import annotations

HOLE = "HOLE"
EXTRA_TAIL = "EXTRA_TAIL"
CONTENT = "CONTENT"
EPOCH = "EPOCH"
HEAD = "HEAD"
EPOCH_HISTORY = "EPOCH_HISTORY"
CONSUMER = "CONSUMER"
UNKNOWN_STREAM = "UNKNOWN_STREAM"
UNLISTED_REPLICA = "UNLISTED_REPLICA"
NOT_EXPORTED = "NOT_EXPORTED"
META_VIEW = "META_VIEW"
VIEW_BEHIND = "VIEW_BEHIND"

MEANING: dict[str, str] = {
    HOLE: "the copy lacks seqs the authority has, inside its own [first_seq, last_seq] or at "
          "or below the committed end",
    EXTRA_TAIL: "the copy holds seqs past the committed end that no majority holds "
                "(an uncommitted tail)",
    CONTENT: "same seq and epoch as the other copies or the authority, different digest",
    EPOCH: "same seq under another epoch than the authority's, or under an epoch the epoch "
           "history does not assign to that seq",
    HEAD: "the copy's head is above the authoritative head (it lacks committed records that "
          "retention has not removed elsewhere); evidence lists the head of each copy",
    EPOCH_HISTORY: "the copy's epochs list disagrees with the metadata's epoch history or "
                   "with the primary's copy",
    CONSUMER: "consumer state that differs from the metadata's, or an ack floor / delivered "
              "seq past the stream's committed end",
    UNKNOWN_STREAM: "a node holds a stream the metadata does not know",
    UNLISTED_REPLICA: "a node holds a copy of a stream that does not list it as a replica",
    NOT_EXPORTED: "a listed replica's node has no export: its copy was not audited",
    META_VIEW: "the node's view of the metadata differs from the newest view "
               "(highest applied index) at the same applied index",
    VIEW_BEHIND: "a note, not a divergence: the node's metadata view (a stream's entry or "
                 "a consumer's state) differs from the newest view, but the node had "
                 "applied fewer Raft entries (exported earlier, or still catching up): Raft "
                 "brings it up to date, and states at different points of the log are not "
                 "compared. Export an idle cluster to judge it",
}

RECORD_CLASSES = (HOLE, EXTRA_TAIL, CONTENT, EPOCH, HEAD)
ORDER = (HOLE, EXTRA_TAIL, CONTENT, EPOCH, HEAD, EPOCH_HISTORY, CONSUMER, UNKNOWN_STREAM,
         UNLISTED_REPLICA, NOT_EXPORTED, META_VIEW)
NOTE_CLASSES = (VIEW_BEHIND,)  # reported apart: they do not make an audit divergent
