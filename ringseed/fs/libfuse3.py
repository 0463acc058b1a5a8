"""The low-level API of libfuse 3 (``libfuse3.so.3``) through ctypes: what the dataset mount uses of it.

Owns the C declarations: the request callbacks' table (``struct fuse_lowlevel_ops``), the structs
replies carry (``struct stat``, ``struct fuse_entry_param``, ``struct fuse_file_info``), and the
functions (``fuse_session_*``, ``fuse_reply_*``, ``fuse_lowlevel_notify_inval_*``).

Rules:
- Only the shared library is needed (Debian's ``libfuse3-3``, which ``fuse3`` depends on): no
  compiler, no headers, no binding from PyPI. The declarations follow libfuse 3.x's headers,
  whose layouts are stable across 3.x for what is used here (the callback table only grows at its
  end; ``fuse_file_info``'s first bits and ``fh`` keep their places), checked against 3.14.
- ``struct stat`` is the kernel ABI's: x86_64 and aarch64 are declared; any other machine is
  :class:`Unavailable` (the caller falls back to the fusepy mount).
- :func:`load` raises :class:`Unavailable` naming what is missing; nothing is loaded at import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import platform
import threading
from typing import Any

c_ino = ctypes.c_uint64  # fuse_ino_t
c_req = ctypes.c_void_p  # fuse_req_t

CAP_NO_OPEN_SUPPORT = 1 << 17
CAP_NO_OPENDIR_SUPPORT = 1 << 24
CAP_AUTO_INVAL_DATA = 1 << 12
CAP_ASYNC_READ = 1 << 0

_KEEP_CACHE = 1 << 2  # fuse_file_info's bit field: writepage, direct_io, keep_cache, flush, nonseekable, ...
_CACHE_READDIR = 1 << 6


class Unavailable(RuntimeError):
    """libfuse 3's low-level API cannot be used here (no library, an unknown machine)."""


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_int64)]


class _StatX8664(ctypes.Structure):
    _fields_ = [
        ("st_dev", ctypes.c_uint64),
        ("st_ino", ctypes.c_uint64),
        ("st_nlink", ctypes.c_uint64),
        ("st_mode", ctypes.c_uint32),
        ("st_uid", ctypes.c_uint32),
        ("st_gid", ctypes.c_uint32),
        ("_pad0", ctypes.c_int32),
        ("st_rdev", ctypes.c_uint64),
        ("st_size", ctypes.c_int64),
        ("st_blksize", ctypes.c_int64),
        ("st_blocks", ctypes.c_int64),
        ("st_atim", Timespec),
        ("st_mtim", Timespec),
        ("st_ctim", Timespec),
        ("_reserved", ctypes.c_int64 * 3),
    ]


class _StatGeneric(ctypes.Structure):  # aarch64 (asm-generic/stat.h)
    _fields_ = [
        ("st_dev", ctypes.c_uint64),
        ("st_ino", ctypes.c_uint64),
        ("st_mode", ctypes.c_uint32),
        ("st_nlink", ctypes.c_uint32),
        ("st_uid", ctypes.c_uint32),
        ("st_gid", ctypes.c_uint32),
        ("st_rdev", ctypes.c_uint64),
        ("_pad1", ctypes.c_uint64),
        ("st_size", ctypes.c_int64),
        ("st_blksize", ctypes.c_int32),
        ("_pad2", ctypes.c_int32),
        ("st_blocks", ctypes.c_int64),
        ("st_atim", Timespec),
        ("st_mtim", Timespec),
        ("st_ctim", Timespec),
        ("_unused", ctypes.c_uint32 * 2),
    ]


_STATS: dict[str, type[ctypes.Structure]] = {"x86_64": _StatX8664, "aarch64": _StatGeneric}
Stat: type[ctypes.Structure] = _STATS.get(platform.machine(), _StatX8664)


class EntryParam(ctypes.Structure):
    _fields_ = [
        ("ino", c_ino),
        ("generation", ctypes.c_uint64),
        ("attr", Stat),
        ("attr_timeout", ctypes.c_double),
        ("entry_timeout", ctypes.c_double),
    ]


class FileInfo(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_int),
        ("bits", ctypes.c_uint32),
        ("padding2", ctypes.c_uint32),
        ("fh", ctypes.c_uint64),
        ("lock_owner", ctypes.c_uint64),
        ("poll_events", ctypes.c_uint32),
    ]


class ConnInfo(ctypes.Structure):
    _fields_ = [
        ("proto_major", ctypes.c_uint),
        ("proto_minor", ctypes.c_uint),
        ("max_write", ctypes.c_uint),
        ("max_read", ctypes.c_uint),
        ("max_readahead", ctypes.c_uint),
        ("capable", ctypes.c_uint),
        ("want", ctypes.c_uint),
        ("max_background", ctypes.c_uint),
        ("congestion_threshold", ctypes.c_uint),
        ("time_gran", ctypes.c_uint),
        ("reserved", ctypes.c_uint * 22),
    ]


class Args(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


class Buf(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("flags", ctypes.c_int),
        ("mem", ctypes.c_void_p),
        ("fd", ctypes.c_int),
        ("pos", ctypes.c_int64),
    ]


_fi = ctypes.POINTER(FileInfo)
INIT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ConnInfo))
LOOKUP = ctypes.CFUNCTYPE(None, c_req, c_ino, ctypes.c_char_p)
FORGET = ctypes.CFUNCTYPE(None, c_req, c_ino, ctypes.c_uint64)
GETATTR = ctypes.CFUNCTYPE(None, c_req, c_ino, _fi)
OPEN = ctypes.CFUNCTYPE(None, c_req, c_ino, _fi)
READ = ctypes.CFUNCTYPE(None, c_req, c_ino, ctypes.c_size_t, ctypes.c_int64, _fi)
READDIR = ctypes.CFUNCTYPE(None, c_req, c_ino, ctypes.c_size_t, ctypes.c_int64, _fi)
STATFS = ctypes.CFUNCTYPE(None, c_req, c_ino)

# struct fuse_lowlevel_ops, in header order (libfuse 3.14); the ones left NULL get libfuse's answer (ENOSYS)
OPS = [
    *("init", "destroy", "lookup", "forget", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink", "rmdir"),
    *("symlink", "rename", "link", "open", "read", "write", "flush", "release", "fsync", "opendir", "readdir"),
    *("releasedir", "fsyncdir", "statfs", "setxattr", "getxattr", "listxattr", "removexattr", "access", "create"),
    *("getlk", "setlk", "bmap", "ioctl", "poll", "write_buf", "retrieve_reply", "forget_multi", "flock", "fallocate"),
    *("readdirplus", "copy_file_range", "lseek"),
]


class LowlevelOps(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in OPS]


def keep_cache(*, directory: bool = False) -> FileInfo:
    """What an ``open`` answers where the kernel cannot skip it: keep the cached pages (and a directory's entries)."""
    info = FileInfo()
    info.bits = _KEEP_CACHE | (_CACHE_READDIR if directory else 0)
    return info


_PINNED = threading.local()
_pinned_count = itertools.count()
PINNED_THREADS = 64  # libfuse's worker threads whose Python thread state is kept (a bound on what is never freed)


def keep_thread_state() -> None:
    """Keep this libfuse worker thread's Python thread state between callbacks.

    A callback from a thread Python did not start creates a thread state on entry and destroys it on
    return (ctypes' ``PyGILState_Ensure``/``Release``): per FUSE request, a third of the mount's CPU in
    a second epoch over small files. One more ``Ensure`` that is never released keeps it; the first
    ``PINNED_THREADS`` threads only, as a state is not freed when its thread ends.
    """
    if getattr(_PINNED, "kept", False):  # (thread-local data lives in the thread state: kept with it)
        return
    if threading.get_ident() == threading.main_thread().ident or next(_pinned_count) >= PINNED_THREADS:
        return
    ctypes.pythonapi.PyGILState_Ensure()
    _PINNED.kept = True


_lib: Any = None


def load() -> Any:
    """``libfuse3.so.3`` with the functions used declared (:class:`Unavailable` when it cannot be used here)."""
    global _lib
    if _lib is not None:
        return _lib
    if platform.machine() not in _STATS:
        raise Unavailable(f"libfuse 3 low-level mount: machine {platform.machine()!r} is not declared")
    name = ctypes.util.find_library("fuse3") or "libfuse3.so.3"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise Unavailable(f"libfuse 3 is not installed ({exc}); apt-get install fuse3") from None
    p = ctypes.c_void_p
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "fuse_version": (ctypes.c_int, []),
        "fuse_session_new": (p, [ctypes.POINTER(Args), ctypes.POINTER(LowlevelOps), ctypes.c_size_t, p]),
        "fuse_session_mount": (ctypes.c_int, [p, ctypes.c_char_p]),
        "fuse_session_unmount": (None, [p]),
        "fuse_session_destroy": (None, [p]),
        "fuse_session_exit": (None, [p]),
        "fuse_session_exited": (ctypes.c_int, [p]),
        "fuse_session_receive_buf": (ctypes.c_int, [p, ctypes.POINTER(Buf)]),
        "fuse_session_process_buf": (None, [p, ctypes.POINTER(Buf)]),
        "fuse_reply_err": (ctypes.c_int, [c_req, ctypes.c_int]),
        "fuse_reply_none": (None, [c_req]),
        "fuse_reply_entry": (ctypes.c_int, [c_req, ctypes.POINTER(EntryParam)]),
        "fuse_reply_attr": (ctypes.c_int, [c_req, ctypes.POINTER(Stat), ctypes.c_double]),
        "fuse_reply_open": (ctypes.c_int, [c_req, ctypes.POINTER(FileInfo)]),
        "fuse_reply_buf": (ctypes.c_int, [c_req, p, ctypes.c_size_t]),
        "fuse_add_direntry": (
            ctypes.c_size_t,
            [c_req, p, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(Stat), ctypes.c_int64],
        ),
        "fuse_lowlevel_notify_inval_inode": (ctypes.c_int, [p, c_ino, ctypes.c_int64, ctypes.c_int64]),
        "fuse_lowlevel_notify_inval_entry": (ctypes.c_int, [p, c_ino, ctypes.c_char_p, ctypes.c_size_t]),
    }
    for func, (restype, argtypes) in sigs.items():
        try:
            fn = getattr(lib, func)
        except AttributeError:
            raise Unavailable(f"{name} has no {func} (libfuse 3.0 or later needed)") from None
        fn.restype, fn.argtypes = restype, argtypes
    loop = getattr(lib, "fuse_session_loop_mt_31", None)  # libfuse's own threads (3.2+): (session, clone_fd)
    if loop is not None:
        loop.restype, loop.argtypes = ctypes.c_int, [p, ctypes.c_int]
    if lib.fuse_version() < 30:
        raise Unavailable(f"{name} reports version {lib.fuse_version()}: libfuse 3 needed")
    _lib = lib
    return lib
