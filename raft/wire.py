"""Restricted pickle: how the Raft library's frames and log entries are decoded without ever
running code.

pysyncobj pickles everything it sends and every log entry it writes, and unpickles what it
receives with `pysyncobj.pickle.loads`, which falls back to the unrestricted pure-Python loader
when the fast one fails. `RestrictedPickle` is a drop-in for that module (the functions its
callers use: `loads`, `dumps`, `load`, `dump`, `to_bytes`): it pickles with protocol 5 and
unpickles with an allowlist of globals, so a frame can only ever produce dicts, lists, tuples,
str, bytes, int, float, bool, None, and the few library classes named here. It never falls back.
`raftlog.raft.syncobj_glue` installs one instance per pysyncobj module (this module imports
nothing of pysyncobj).

What goes where, read from the installed pysyncobj 0.3.17 sources:
- Transport frames (`tcp_connection.py`): message dicts of str/int/bool/bytes and lists of
  `(command: bytes, index: int, term: int)` tuples; a node's address (str) or a random key
  (bytes) as first message; `(key, message)` tuples when encrypted. No class at all: the only
  frames that carry library objects (`Node`, in the reply to a `status` utility command) are
  ones a member never receives.
- Log entries (`syncobj.py`): a regular command is `(method id, (command bytes,))`; a
  membership change is `['add'|'rem', node id, TCPNode]`, so `pysyncobj.node.TCPNode` is the
  one class allowed there; a code-version entry is an int.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable
from typing import IO, Any

# Every node must use the same protocol; 5 keeps bytes as bytes (protocol 2, pysyncobj's
# default, turns them into latin-1 text and nearly triples their size).
pickle_protocol = 5

# Globals each path may name (module, qualified name).
TRANSPORT_GLOBALS: frozenset[tuple[str, str]] = frozenset()
LOG_GLOBALS: frozenset[tuple[str, str]] = frozenset({("pysyncobj.node", "TCPNode")})


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], *, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._allowed:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load global {module}.{name}")


class RestrictedPickle:
    """Stands in for the module `pysyncobj.pickle` inside one pysyncobj module."""

    def __init__(self, *, allowed_globals: frozenset[tuple[str, str]], what: str) -> None:
        self.allowed_globals = allowed_globals
        self.what = what
        self._lock = threading.Lock()
        self.refused = 0  # payloads refused so far (not all are attacks: also corrupt ones)
        # Called (in the unpickling thread) with the error of each refused payload.
        self.on_refused: list[Callable[[Exception], None]] = []

    @staticmethod
    def to_bytes(data: bytes | str) -> bytes:
        return data if isinstance(data, bytes) else data.encode("utf-8")

    def loads(self, data: bytes | str) -> Any:
        return self.load(io.BytesIO(self.to_bytes(data)))

    def load(self, file: IO[bytes]) -> Any:
        try:
            return _RestrictedUnpickler(file, allowed=self.allowed_globals).load()
        except Exception as err:
            with self._lock:
                self.refused += 1
                listeners = list(self.on_refused)
            for listener in listeners:
                listener(err)
            raise

    @staticmethod
    def dumps(obj: object, protocol: int | None = None) -> bytes:
        return pickle.dumps(obj, pickle_protocol)

    @staticmethod
    def dump(obj: object, file: IO[bytes], protocol: int | None = None) -> None:
        pickle.dump(obj, file, pickle_protocol)
