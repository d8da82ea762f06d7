"""powerfs (raftlog.chaos.powerfs): what survives a power cut on the mount, and what does not.

Each test mounts its own powerfs over tmp_path and unmounts it; the RocksDB tests start one
writer process each and kill only that process. Without a usable FUSE the tests skip with the
reason ensure_fuse() gives. The extent model is checked against a bytearray without FUSE.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.base.files import fsync_dir
from raftlog.chaos.powerfs import PowerFs, ensure_fuse
from raftlog.chaos.powerfs.extents import DirtyFile

test_timeout_s = 120
writer_acks_min = 2000  # synced writes a RocksDB writer acknowledges before it is killed
writer_wait_s = 90.0
PAGE = 4096


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[PowerFs]:
    reason = ensure_fuse()
    if reason is not None:
        pytest.skip(f"FUSE unusable: {reason}")
    mounted = PowerFs.mount(tmp_path / "backing", tmp_path / "mnt")
    try:
        yield mounted
    finally:
        mounted.unmount()


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes, *, sync: bool) -> None:
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        if sync:
            os.fsync(file.fileno())


def durable_file(path: Path, data: bytes) -> None:
    """A file whose data and entry are both durable."""
    write_file(path, data, sync=True)
    fsync_dir(path.parent)


# -- the extent model, no FUSE -------------------------------------------------------------------


@pytest.mark.timeout(test_timeout_s)
@pytest.mark.parametrize("seed", range(20))
def test_dirty_file_reads_what_a_bytearray_would_hold(seed: int) -> None:
    rng = random.Random(seed)
    durable = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 3 * PAGE)))
    live = bytearray(durable)
    dirty = DirtyFile(durable_size=len(durable), seq=1)
    for _ in range(200):
        if rng.random() < 0.15:
            size = rng.randrange(0, 4 * PAGE)
            dirty.truncate(size)
            live = live[:size] + bytes(max(0, size - len(live)))
        else:
            offset = len(live) if rng.random() < 0.4 else rng.randrange(0, 4 * PAGE)
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600)))
            dirty.write(offset, data)
            live += bytes(max(0, offset - len(live)))
            live[offset:offset + len(data)] = data
        start, end = dirty.durable_range(0, len(live) + 10)
        assert dirty.read(0, len(live) + 10, durable[start:end]) == live, f"seed={seed}"
    plan = dirty.flush_plan()
    flushed = bytearray(durable if plan.cut_to is None else durable[:plan.cut_to])
    for offset, data in plan.writes:
        flushed += bytes(max(0, offset + len(data) - len(flushed)))
        flushed[offset:offset + len(data)] = data
    flushed = flushed[:plan.size] + bytes(max(0, plan.size - len(flushed)))
    assert flushed == live, f"seed={seed}"


# -- data ----------------------------------------------------------------------------------------


@pytest.mark.timeout(test_timeout_s)
def test_an_fsynced_write_survives_a_drop(fs: PowerFs) -> None:
    path = fs.mountpoint / "wal"
    durable_file(path, b"synced")
    fs.drop()
    assert path.read_bytes() == b"synced"
    assert (fs.backing / "wal").read_bytes() == b"synced"


@pytest.mark.timeout(test_timeout_s)
def test_a_write_without_fsync_is_gone_after_a_drop(fs: PowerFs) -> None:
    path = fs.mountpoint / "wal"
    durable_file(path, b"synced|")
    with open(path, "ab") as file:
        file.write(b"unsynced")
    with open(path, "r+b") as file:
        file.write(b"S")
    assert fs.status().unsynced_bytes > 0
    assert (fs.backing / "wal").read_bytes() == b"synced|"
    report = fs.drop()
    assert report["dropped_files"] == 1, report
    assert path.read_bytes() == b"synced|"
    assert fs.status().unsynced_bytes == 0


@pytest.mark.timeout(test_timeout_s)
def test_reads_see_unsynced_data_before_a_drop(fs: PowerFs) -> None:
    path = fs.mountpoint / "data"
    durable_file(path, b"a" * (3 * PAGE))
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"middle", PAGE + 10)
        os.pwrite(fd, b"tail", 5 * PAGE)  # past the end: a hole of zeros before it
        assert os.fstat(fd).st_size == 5 * PAGE + 4
    finally:
        os.close(fd)
    expected = bytearray(b"a" * (3 * PAGE) + bytes(2 * PAGE) + b"tail")
    expected[PAGE + 10:PAGE + 16] = b"middle"
    assert path.read_bytes() == expected
    assert path.stat().st_size == len(expected)
    os.truncate(path, PAGE)
    assert path.read_bytes() == b"a" * PAGE
    fs.drop()
    assert path.read_bytes() == b"a" * (3 * PAGE)


@pytest.mark.timeout(test_timeout_s)
def test_handles_open_across_a_drop_answer_eio(fs: PowerFs) -> None:
    path = fs.mountpoint / "f"
    durable_file(path, b"x")
    with open(path, "r+b", buffering=0) as file:
        fs.drop()
        with pytest.raises(OSError) as raised:
            file.write(b"y")
        assert raised.value.errno == errno.EIO


# -- namespace -----------------------------------------------------------------------------------


@pytest.mark.timeout(test_timeout_s)
@pytest.mark.parametrize("dir_synced", [False, True])
def test_a_created_file_needs_its_directory_fsynced(fs: PowerFs, dir_synced: bool) -> None:
    (fs.mountpoint / "db").mkdir()
    fsync_dir(fs.mountpoint)
    path = fs.mountpoint / "db" / "000001.sst"
    write_file(path, b"table", sync=True)
    if dir_synced:
        fsync_dir(path.parent)
    fs.drop()
    assert path.exists() == dir_synced
    if dir_synced:
        assert path.read_bytes() == b"table"


@pytest.mark.timeout(test_timeout_s)
def test_a_new_directory_and_everything_in_it_is_gone_unless_its_parent_is_fsynced(
        fs: PowerFs) -> None:
    directory = fs.mountpoint / "node1" / "db"
    directory.mkdir(parents=True)
    durable_file(directory / "CURRENT", b"MANIFEST-1\n")
    fsync_dir(directory.parent)  # node1 holds db durably; the root does not hold node1
    fs.drop()
    assert list(fs.mountpoint.iterdir()) == []
    assert list(fs.backing.iterdir()) == []


@pytest.mark.timeout(test_timeout_s)
@pytest.mark.parametrize("dir_synced", [False, True])
def test_a_rename_over_a_file_needs_its_directory_fsynced(fs: PowerFs, dir_synced: bool) -> None:
    current = fs.mountpoint / "CURRENT"
    durable_file(current, b"MANIFEST-1\n")
    temp = fs.mountpoint / "CURRENT.tmp"
    write_file(temp, b"MANIFEST-2\n", sync=True)
    temp.rename(current)
    assert current.read_bytes() == b"MANIFEST-2\n"
    if dir_synced:
        fsync_dir(fs.mountpoint)
    fs.drop()
    assert current.read_bytes() == (b"MANIFEST-2\n" if dir_synced else b"MANIFEST-1\n")
    assert sorted(p.name for p in fs.mountpoint.iterdir()) == ["CURRENT"]


@pytest.mark.timeout(test_timeout_s)
def test_an_unlink_without_a_directory_fsync_is_undone(fs: PowerFs) -> None:
    (fs.mountpoint / "sub").mkdir()
    fsync_dir(fs.mountpoint)
    old = fs.mountpoint / "sub" / "000004.log"
    durable_file(old, b"old wal")
    old.unlink()
    (fs.mountpoint / "sub").rmdir()
    assert not (fs.mountpoint / "sub").exists()
    assert fs.status().unsynced_names == 2
    fs.drop()
    assert old.read_bytes() == b"old wal"


@pytest.mark.timeout(test_timeout_s)
def test_a_rename_across_directories_and_back_leaves_the_durable_tree(fs: PowerFs) -> None:
    for name in ("a", "b"):
        (fs.mountpoint / name).mkdir()
    fsync_dir(fs.mountpoint)
    durable_file(fs.mountpoint / "a" / "f", b"f")
    durable_file(fs.mountpoint / "b" / "g", b"g")
    (fs.mountpoint / "a" / "f").rename(fs.mountpoint / "b" / "f")
    (fs.mountpoint / "b" / "g").rename(fs.mountpoint / "a" / "f")
    (fs.mountpoint / "a").rename(fs.mountpoint / "c")
    fs.drop()
    assert sorted(p.name for p in fs.mountpoint.iterdir()) == ["a", "b"]
    assert (fs.mountpoint / "a" / "f").read_bytes() == b"f"
    assert (fs.mountpoint / "b" / "g").read_bytes() == b"g"
    assert [p.name for p in (fs.mountpoint / "b").iterdir()] == ["g"]


class _TreeModel:
    """What a strict POSIX disk holds: file data durable at fsync, a directory's entries durable
    at its fsync. Inode 0 is the root. Directories move only within their parent (a directory
    with two durable parents cannot exist on a real disk)."""

    def __init__(self) -> None:
        self.next_ino = 1
        self.live: dict[int, dict[str, int]] = {0: {}}  # directory -> name -> inode
        self.durable: dict[int, dict[str, int]] = {0: {}}
        self.live_data: dict[int, bytes] = {}  # file -> bytes
        self.durable_data: dict[int, bytes] = {}

    def entries(self) -> list[tuple[str, int, int]]:
        """Live (path, parent, inode), the root first."""
        found, pending = [("", -1, 0)], [("", 0)]
        while pending:
            path, directory = pending.pop()
            for name, ino in sorted(self.live[directory].items()):
                found.append((f"{path}/{name}", directory, ino))
                if ino in self.live:
                    pending.append((f"{path}/{name}", ino))
        return found

    def durable_tree(self) -> dict[str, bytes | None]:
        tree: dict[str, bytes | None] = {}
        pending = [("", 0)]
        while pending:
            path, directory = pending.pop()
            for name, ino in self.durable[directory].items():
                is_dir = ino in self.durable
                tree[f"{path}/{name}"] = None if is_dir else self.durable_data.get(ino, b"")
                if is_dir:
                    pending.append((f"{path}/{name}", ino))
        return tree

    def new_ino(self, *, directory: bool) -> int:
        ino, self.next_ino = self.next_ino, self.next_ino + 1
        if directory:
            self.live[ino], self.durable[ino] = {}, {}
        else:
            self.live_data[ino], self.durable_data[ino] = b"", b""
        return ino

    def power_cut(self) -> None:
        self.live = {ino: dict(names) for ino, names in self.durable.items()}
        self.live_data = dict(self.durable_data)


def _actual_tree(root: Path) -> dict[str, bytes | None]:
    tree: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        key = "/" + str(path.relative_to(root))
        tree[key] = None if path.is_dir() else path.read_bytes()
    return tree


def _can_replace(model: _TreeModel, *, source: int, target: int | None) -> bool:
    """Whether rename(2) of `source` onto `target` succeeds (and is not a no-op)."""
    if target is None:
        return True
    if target == source or (source in model.live) != (target in model.live):
        return False
    return not model.live.get(target)  # a file, or an empty directory


def _random_step(rng: random.Random, model: _TreeModel, mnt: Path) -> None:
    entries = model.entries()
    dirs = [(path, ino) for path, _, ino in entries if ino in model.live]
    files = [(path, parent, ino) for path, parent, ino in entries if ino not in model.live]
    op = rng.choice(["create", "create", "mkdir", "write", "write", "truncate", "fsync",
                     "fsync", "fsyncdir", "fsyncdir", "rename", "rename", "unlink", "rmdir"])
    name = rng.choice("abcde")
    dir_path, dir_ino = rng.choice(dirs)
    if op in ("create", "mkdir") and name not in model.live[dir_ino]:
        ino = model.new_ino(directory=op == "mkdir")
        model.live[dir_ino][name] = ino
        if op == "mkdir":
            (mnt / f"{dir_path}/{name}".lstrip("/")).mkdir()
        else:
            (mnt / f"{dir_path}/{name}".lstrip("/")).write_bytes(b"")
    elif op == "fsyncdir":
        model.durable[dir_ino] = dict(model.live[dir_ino])
        fsync_dir(mnt / dir_path.lstrip("/") if dir_path else mnt)
    elif op in ("write", "truncate", "fsync", "unlink") and files:
        path, parent, ino = rng.choice(files)
        target = mnt / path.lstrip("/")
        if op == "write":
            data = rng.randbytes(rng.randrange(1, 3 * PAGE))
            with open(target, "ab") as file:
                file.write(data)
            model.live_data[ino] += data
        elif op == "truncate":
            size = rng.randrange(0, len(model.live_data[ino]) + 1)
            os.truncate(target, size)
            model.live_data[ino] = model.live_data[ino][:size]
        elif op == "fsync":
            fsync_file(target)
            model.durable_data[ino] = model.live_data[ino]
        else:
            target.unlink()
            del model.live[parent][path.rsplit("/", 1)[1]]
    elif op == "rmdir" and dir_ino != 0 and not model.live[dir_ino]:
        parent = next(parent for path, parent, ino in entries if ino == dir_ino)
        (mnt / dir_path.lstrip("/")).rmdir()
        del model.live[parent][dir_path.rsplit("/", 1)[1]]
    elif op == "rename" and len(entries) > 1:
        path, parent, ino = rng.choice(entries[1:])
        new_parent = parent if ino in model.live else dir_ino
        new_parent_path = next(p for p, _, i in entries if i == new_parent)
        if not _can_replace(model, source=ino, target=model.live[new_parent].get(name)):
            return
        (mnt / path.lstrip("/")).rename(mnt / f"{new_parent_path}/{name}".lstrip("/"))
        del model.live[parent][path.rsplit("/", 1)[1]]
        model.live[new_parent][name] = ino


@pytest.mark.timeout(test_timeout_s)
@pytest.mark.parametrize("seed", range(8))
def test_random_operations_then_a_drop_leave_what_a_strict_disk_holds(
        fs: PowerFs, seed: int) -> None:
    rng = random.Random(seed)
    model = _TreeModel()
    for cut in range(3):
        for _ in range(80):
            _random_step(rng, model, fs.mountpoint)
        assert _actual_tree(fs.mountpoint) == {
            path: None if ino in model.live else model.live_data[ino]
            for path, _, ino in model.entries()[1:]}, f"live tree, seed={seed} cut={cut}"
        fs.drop()
        model.power_cut()
        expected = model.durable_tree()
        assert _actual_tree(fs.mountpoint) == expected, f"after drop, seed={seed} cut={cut}"
        assert _actual_tree(fs.backing) == expected, f"backing, seed={seed} cut={cut}"


# -- partial writeback ---------------------------------------------------------------------------


def _pages_kept(fs: PowerFs, *, seed: int, pages: int) -> list[int]:
    path = fs.mountpoint / "sst"
    if path.exists():
        path.unlink()
    durable_file(path, b"")
    write_file(path, b"".join(bytes([index + 1]) * PAGE for index in range(pages)), sync=False)
    report = fs.writeback(seed=seed, fraction=0.5)
    assert report["dropped_files"] == 1, report
    data = path.read_bytes()
    assert len(data) % PAGE == 0
    kept = []
    for index in range(len(data) // PAGE):
        page = data[index * PAGE:(index + 1) * PAGE]
        assert page in (bytes(PAGE), bytes([index + 1]) * PAGE), index  # whole page or hole
        if page != bytes(PAGE):
            kept.append(index)
    return kept


@pytest.mark.timeout(test_timeout_s)
def test_a_partial_writeback_keeps_a_seeded_subset_of_pages(fs: PowerFs) -> None:
    pages = 64
    kept = _pages_kept(fs, seed=11, pages=pages)
    assert 0 < len(kept) < pages, kept
    assert _pages_kept(fs, seed=11, pages=pages) == kept
    assert _pages_kept(fs, seed=12, pages=pages) != kept


@pytest.mark.timeout(test_timeout_s)
def test_unsynced_data_past_its_memory_bound_is_written_back_oldest_first(tmp_path: Path) -> None:
    reason = ensure_fuse()
    if reason is not None:
        pytest.skip(f"FUSE unusable: {reason}")
    bound = 256 * 1024
    with PowerFs.mount(tmp_path / "backing", tmp_path / "mnt", dirty_bytes_max=bound) as fs:
        old, new = fs.mountpoint / "old", fs.mountpoint / "new"
        durable_file(old, b"")
        durable_file(new, b"")
        write_file(old, b"o" * bound, sync=False)
        write_file(new, b"n" * PAGE, sync=False)
        status = fs.status()
        assert status.forced_writeback_bytes >= bound, status
        assert status.unsynced_bytes <= bound, status
        fs.drop()
        assert old.read_bytes() == b"o" * bound  # written back: a power cut cannot lose it
        assert new.read_bytes() == b""


# -- injected faults -----------------------------------------------------------------------------


@pytest.mark.timeout(test_timeout_s)
def test_a_full_disk_answers_enospc_until_ok(fs: PowerFs) -> None:
    path = fs.mountpoint / "f"
    durable_file(path, b"")
    fs.set_full(10)
    fd = os.open(path, os.O_WRONLY)
    try:
        assert os.write(fd, b"x" * 25) == 10  # a short write, then nothing fits
        with pytest.raises(OSError) as raised:
            os.write(fd, b"x")
        assert raised.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    with pytest.raises(OSError) as raised:
        (fs.mountpoint / "new").write_bytes(b"")
    assert raised.value.errno == errno.ENOSPC
    assert fs.status().full_bytes_left == 0
    fs.ok()
    (fs.mountpoint / "new").write_bytes(b"fits")
    assert (fs.mountpoint / "new").read_bytes() == b"fits"


@pytest.mark.timeout(test_timeout_s)
def test_eio_fails_matching_paths_until_ok(fs: PowerFs) -> None:
    log_path, other = fs.mountpoint / "000007.log", fs.mountpoint / "000008.sst"
    durable_file(log_path, b"wal")
    durable_file(other, b"sst")
    fs.set_eio("*.log", ops=("read",))
    with pytest.raises(OSError) as raised:
        log_path.read_bytes()
    assert raised.value.errno == errno.EIO
    assert other.read_bytes() == b"sst"
    fs.ok()
    fs.set_eio("/000007.*", ops=("write", "fsync"))
    with open(log_path, "ab", buffering=0) as file:
        with pytest.raises(OSError) as raised:
            file.write(b"more")
        assert raised.value.errno == errno.EIO
    fd = os.open(log_path, os.O_RDWR)
    try:
        with pytest.raises(OSError) as raised:
            os.fsync(fd)
        assert raised.value.errno == errno.EIO
    finally:
        os.close(fd)
    assert fs.status().injected_errors >= 3
    fs.ok()
    with open(log_path, "ab") as file:
        file.write(b"+")
        file.flush()
        os.fsync(file.fileno())
    assert log_path.read_bytes() == b"wal+"


# -- RocksDB, killed mid-stream ------------------------------------------------------------------

# Writes key seq (8 bytes, big-endian) with a 2 KiB value, fsyncs the WAL every few writes, and
# prints the last seq made durable after each fsync. argv: data dir, writer kind.
WRITER = """
import sys
from pathlib import Path

kind, data_dir = sys.argv[1], Path(sys.argv[2])
value = bytes(range(256)) * 8
if kind == "storage":
    from raftlog.node.engine.storage import CF_MESSAGES, Storage
    storage = Storage(data_dir)
    handle = storage.handle(CF_MESSAGES)
    def put(seq):
        batch = storage.batch()
        batch.put(seq.to_bytes(8, "big"), value, handle)
        storage.write(batch)
    sync = storage.sync
else:
    from rocksdict import Options, Rdict, WriteOptions
    from raftlog.base.files import ensure_dir, fsync_dir
    ensure_dir(data_dir)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(256 * 1024)  # memtable flushes: new SSTs, MANIFEST, renames
    db = Rdict(str(data_dir / "db"), options)
    if kind == "rdict_small_memtable":
        fsync_dir(data_dir)  # RocksDB does not make its own directory's entry durable
    unsynced = WriteOptions()
    def put(seq):
        db.put(seq.to_bytes(8, "big"), value, unsynced)
    def sync():
        db.flush_wal(True)
for seq in range(10_000_000):
    put(seq)
    if seq % 4 == 3:
        sync()
        print(seq, flush=True)
"""


def _read_durable(kind: str, data_dir: Path) -> list[int]:
    """The seqs in the database, ascending (opening it must succeed)."""
    if kind == "storage":
        from raftlog.node.engine.storage import CF_MESSAGES, Storage

        storage = Storage(data_dir)
        try:
            keys = list(storage.scan_keys(CF_MESSAGES, lower=b"", upper=b"\xff" * 9))
            values_ok = all(storage.get(CF_MESSAGES, key) == bytes(range(256)) * 8
                            for key in keys)
        finally:
            storage.close()
    else:
        from rocksdict import Options, Rdict

        options = Options(raw_mode=True)
        options.create_if_missing(False)
        db = Rdict(str(data_dir / "db"), options)
        try:
            items = list(db.items())
        finally:
            db.close()
        keys = [key for key, _ in items]
        values_ok = all(value == bytes(range(256)) * 8 for _, value in items)
    assert values_ok, "a recovered value differs from what was written"
    return [int.from_bytes(key, "big") for key in keys]


def _run_writer_until_killed(kind: str, data_dir: Path) -> int:
    """Starts the writer, kills it (-9) after `writer_acks_min` durable writes; returns the
    highest seq it reported durable."""
    process = subprocess.Popen([sys.executable, "-c", WRITER, kind, str(data_dir)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked = -1
    deadline = time.monotonic() + writer_wait_s
    try:
        if process.stdout is None:
            raise RuntimeError("the writer has no stdout pipe")
        for line in process.stdout:
            acked = int(line)
            if acked >= writer_acks_min or time.monotonic() > deadline:
                break
    finally:
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate(timeout=30)
    assert acked >= writer_acks_min, f"writer acked only {acked}: {stderr[-2000:]}"
    return acked


@pytest.mark.timeout(test_timeout_s)
@pytest.mark.parametrize("kind", ["storage", "rdict_small_memtable"])
@pytest.mark.parametrize("cut", ["drop", "writeback"])
def test_rocksdb_keeps_every_synced_write_through_kill_and_power_loss(
        fs: PowerFs, kind: str, cut: str) -> None:
    data_dir = fs.mountpoint / "node1"
    acked = _run_writer_until_killed(kind, data_dir)
    status = fs.status()
    report = fs.drop() if cut == "drop" else fs.writeback(seed=acked, fraction=0.5)
    durable = _read_durable(kind, data_dir)
    detail = f"acked={acked} status={status} report={report}"
    assert durable[:acked + 1] == list(range(acked + 1)), detail
    assert durable == list(range(len(durable))), f"recovery is not a prefix: {detail}"


@pytest.mark.timeout(test_timeout_s)
def test_rocksdb_is_lost_when_nobody_fsyncs_the_directory_that_holds_it(fs: PowerFs) -> None:
    """DESIGN §3: RocksDB never fsyncs the parent of its directory; powerfs shows the cost."""
    data_dir = fs.mountpoint / "node1"
    _run_writer_until_killed("rdict_parent_not_fsynced", data_dir)
    fs.drop()
    assert not (data_dir / "db").exists()
