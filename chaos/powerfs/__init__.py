"""powerfs: a FUSE file system that models power loss for the chaos harness.

It passes everything through to a backing directory except what a power cut could lose: file
data and sizes not yet fsynced (kept in memory, visible to the live system) and directory
entries (creates, renames, unlinks) whose directory was not yet fsynced. On command it drops
all of that (`drop`), writes back a seeded random part first (`writeback`), fills the disk
(`set_full`), or fails paths with EIO (`set_eio`).

Modules: extents (one file's unsynced data, no I/O), namespace (unsynced directory entries and
how a drop rebuilds the durable tree), faults (ENOSPC/EIO state), fs (the FUSE operations and
every durability rule), control (the control socket protocol), server (the FUSE process),
client (`PowerFs`, what the harness uses), install (`ensure_fuse`).
"""

from raftlog.chaos.powerfs.client import PowerFs, PowerFsError, PowerFsStatus
from raftlog.chaos.powerfs.install import ensure_fuse

__all__ = ["PowerFs", "PowerFsError", "PowerFsStatus", "ensure_fuse"]
