"""Node ids on the Waymaker API: the seed names a node by a uint64, raftlog by a string such as
"n1". One mapping, used by every Waymaker call that names a node:

- "n<digits>" and "<digits>" map to that number when it is between 1 and 2**62 - 1
  ("n7" -> 7, "42" -> 42);
- any other id maps to a stable 63-bit hash of its text with bit 62 set (so it never equals a
  number of the first rule, and never 0, which the seed reserves for "none").

The reverse goes through the current membership: the member whose id maps to the number.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

_NUMBERED = re.compile(r"n?([0-9]{1,19})")
_HASH_BIT = 1 << 62


def to_wire(node_id: str) -> int:
    """The uint64 a raftlog node id is shown as; 0 for the empty id (none)."""
    if not node_id:
        return 0
    numbered = _NUMBERED.fullmatch(node_id)
    if numbered is not None:
        number = int(numbered.group(1))
        if 0 < number < _HASH_BIT:
            return number
    digest = hashlib.sha256(node_id.encode()).digest()
    return (int.from_bytes(digest[:8], "big") & (_HASH_BIT - 1)) | _HASH_BIT


def from_wire(number: int, members: Iterable[str]) -> str | None:
    """The member shown as `number`, or None when no member is."""
    for member in members:
        if number and to_wire(member) == number:
            return member
    return None
