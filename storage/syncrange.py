"""Bytes of one file made durable by another file's flush: ``sync_file_range`` and when it holds.

An ``fdatasync`` does two things: it writes the file's dirty pages (and any metadata needed to
read them back, such as the size or an extent's allocation) to the device, then it asks the
device to flush its volatile write cache.  Two files made durable by two ``fdatasync`` calls
cost two cache flushes, and a device serialises them (measured: a 48-byte entry of
``producers.idem`` beside a log write took 184-268 µs at p50 against 122-136 µs for the log
alone, ``docs/benchmarks.md``).

``sync_file_range(fd, off, n, WAIT_BEFORE | WRITE | WAIT_AFTER)`` does only the first half for a
range of one file: when it returns, the range's pages have reached the device, but possibly
only its cache, and no metadata was written.  A *later* ``fdatasync`` of any file on the same
device flushes that cache, so it makes those pages durable too.  Both ext4 and XFS issue the
flush on every ``fdatasync``, also when the file had nothing dirty (ext4's ``ext4_sync_file``
through the journal commit or ``blkdev_issue_flush``; XFS's ``xfs_file_fsync``).

That is only enough when the range needs no metadata: its blocks must already be allocated,
written (not *unwritten* extents, which a first write converts in the journal) and inside the
file's durable size, and the filesystem must overwrite them in place.  So a file written this
way is first filled with zeros and fdatasynced (:mod:`pymetaq.storage.producers` keeps such a
reserve), and :func:`in_place_filesystem` admits only filesystems that overwrite in place: ext4
(not mounted ``data=journal``, where data goes through the journal) and XFS.  A copy-on-write
filesystem (btrfs, ZFS) writes an overwrite to new blocks and needs its metadata committed, so
there the caller keeps to ``fdatasync``.  tmpfs has no device: an fsync there is a no-op anyway.

Thread-safety: the functions keep no state but a cache of filesystem answers per device
(a dict, set under the GIL).
"""

from __future__ import annotations

import ctypes
import os
import sys

#: ``sync_file_range`` flags (``<fcntl.h>``)
WAIT_BEFORE, WRITE, WAIT_AFTER = 1, 2, 4
_ALL = WAIT_BEFORE | WRITE | WAIT_AFTER

#: ``statfs`` filesystem magics (``<linux/magic.h>``) whose overwrites stay in place
EXT4_MAGIC = 0xEF53  # ext2, ext3 and ext4 share it
XFS_MAGIC = 0x58465342
TMPFS_MAGIC = 0x01021994
_IN_PLACE = {EXT4_MAGIC: "ext4", XFS_MAGIC: "xfs", TMPFS_MAGIC: "tmpfs"}


def _libc_call(name: str) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's
        return getattr(libc, name)
    except (OSError, AttributeError):
        return None


_sync_file_range = _libc_call("sync_file_range")
if _sync_file_range is not None:
    # glibc's symbol takes 64-bit offsets on every ABI (it is the off64_t function)
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int
_statfs = _libc_call("statfs")
if _statfs is not None:
    _statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    _statfs.restype = ctypes.c_int

#: can :func:`range_sync` run here at all (Linux with glibc or musl)
AVAILABLE = _sync_file_range is not None and _statfs is not None


def _call(fd: int, offset: int, nbytes: int, flags: int) -> None:
    if _sync_file_range is None:
        raise OSError(38, "sync_file_range is not available")  # ENOSYS
    if _sync_file_range(fd, offset, nbytes, flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sync_file_range: {os.strerror(err)}")


def range_sync(fd: int, offset: int, nbytes: int) -> None:
    """Write ``nbytes`` at ``offset`` of ``fd`` to the device and wait for them, also for a
    write :func:`start_writeback` started (no flush of the device's cache, no metadata: see
    the module docstring); raises ``OSError``."""
    _call(fd, offset, nbytes, _ALL)


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing the dirty pages of ``nbytes`` at ``offset`` of ``fd`` to the device, and
    return without waiting; raises ``OSError``.  Only a hint: it makes nothing durable, but a
    later :func:`range_sync` or fdatasync of the range finds the write under way, so two files
    started one after the other are written to the device at the same time."""
    _call(fd, offset, nbytes, WRITE)


def filesystem_magic(path: str) -> int | None:
    """The ``f_type`` of the filesystem holding ``path`` (``statfs``), or None."""
    if _statfs is None:
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86-64
    if _statfs(os.fsencode(path), buf) != 0:
        return None
    # f_type is the first field, a C long (__fsword_t) on every Linux ABI
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def _mount_options(path: str) -> set[str] | None:
    """The superblock options of the mount holding ``path`` (``/proc/self/mountinfo``)."""
    try:
        dev = os.stat(path).st_dev
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = f"{os.major(dev)}:{os.minor(dev)}"
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[2] == want and "-" in fields:
            rest = fields[fields.index("-") + 1 :]  # fstype, source, super options
            if len(rest) >= 3:
                return set(rest[2].split(","))
    return None


_answers: dict[int, str | None] = {}


def in_place_filesystem(path: str) -> str | None:
    """The name of the filesystem holding ``path`` if :func:`range_sync` plus another file's
    ``fdatasync`` makes prewritten blocks of it durable (the module docstring), else None."""
    if not AVAILABLE:
        return None
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    if dev in _answers:
        return _answers[dev]
    name = _IN_PLACE.get(filesystem_magic(path) or 0)
    if name == "ext4":
        options = _mount_options(path)
        if options is None or "data=journal" in options:
            name = None
    _answers[dev] = name
    return name
