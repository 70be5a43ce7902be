"""A persistent, per-user store of byte strings by key: compiled regions across processes.

Storage only: it knows nothing of regions, torch or backends (``runtime/region_store.py``
keys and loads compiled regions with it; any other user, an optimizer step for one, can
call :meth:`DiskCache.get` / :meth:`DiskCache.put` with keys of its own).

+---------------------+-------------------------------------------------------------------+
| property            | how                                                               |
+=====================+===================================================================+
| where               | ``cache_dir`` option / ``ADAPTIVE_EAGER_CACHE_DIR``; default       |
|                     | ``$XDG_CACHE_HOME/adaptive_eager`` or ``~/.cache/adaptive_eager``  |
| bounded             | least recently used entries (by mtime, touched on each hit) are    |
|                     | deleted once the entries exceed ``max_bytes``                      |
| two writers at once | each writes a private temporary file and renames it into place     |
|                     | (atomic): a reader sees a whole old entry or a whole new one       |
| damage              | each entry carries its length and SHA-256: a truncated, corrupt    |
|                     | or older-format entry is skipped and deleted, never loaded         |
| not a way in        | Note [The cache is not a way in]                                   |
+---------------------+-------------------------------------------------------------------+

Example::

    >>> import tempfile
    >>> folder = tempfile.TemporaryDirectory()  # removed with the object
    >>> cache = DiskCache(folder.name, max_bytes=1 << 20)
    >>> cache.put("answer", b"42"), cache.get("answer"), cache.get("other")
    (True, b'42', None)
    >>> cache.info().entries
    1
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("adaptive_eager")

# Bumped when the entry layout changes: entries of another format are skipped and deleted.
MAGIC = b"AEDC\x01"
_HEAD = len(MAGIC) + 32 + 8  # magic, SHA-256 of the payload, payload length (little endian)
SUFFIX = ".bin"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0  # a writer's temporary file older than this was left by a crash

DEFAULT_MAX_BYTES = 1 << 30


def default_dir() -> str:
    """The per-user cache folder: ``$XDG_CACHE_HOME/adaptive_eager``, else
    ``~/.cache/adaptive_eager`` (never a shared temporary folder).

    Example::

        >>> default_dir().endswith("adaptive_eager")
        True
    """
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not base or not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "adaptive_eager")


def resolve_dir(option: str) -> str | None:
    """The folder the ``cache_dir`` option names: None when it is off ("" or "off"),
    :func:`default_dir` for "auto", else the path (``~`` expanded, made absolute).

    Example::

        >>> resolve_dir("off") is None, resolve_dir("") is None
        (True, True)
        >>> resolve_dir("/x/y")
        '/x/y'
    """
    text = option.strip()
    if text.lower() in ("", "off", "0", "false", "no", "none"):
        return None
    if text.lower() == "auto":
        return default_dir()
    return os.path.abspath(os.path.expanduser(text))


@dataclass(frozen=True)
class CacheInfo:
    """What :meth:`DiskCache.info` reports."""

    path: str
    entries: int
    bytes: int
    max_bytes: int
    usable: bool
    problem: str = ""  # why it is not usable


# Note [The cache is not a way in]
# An entry holds code that runs (compiled kernels, pickled graphs), so loading one is
# running it. The folder is created owner-only (0700); before anything is read, the
# folder and then each entry must belong to this user and be writable by nobody else
# (no group/other write bit), and an entry must be a regular file (opened with
# O_NOFOLLOW: a symlink planted in its place is refused). Otherwise the cache warns
# once, naming the path, and is off for the rest of the process: the program runs as
# if it had no cache. The default folder is under the user's home (XDG), never a shared
# temporary folder. The digest in each entry guards against damage (a truncated write,
# a full disk), not against the user: whoever can write the folder can run code as the
# user anyway.
def _unsafe(st: os.stat_result, kind: str) -> str:
    """Why a file or folder with status ``st`` must not be trusted ("" if it may)."""
    if st.st_uid != os.geteuid():
        return f"{kind} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{kind} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _file_name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:40] + SUFFIX


def _pack(payload: bytes) -> bytes:
    return MAGIC + hashlib.sha256(payload).digest() + len(payload).to_bytes(8, "little") + payload


def _unpack(blob: bytes) -> bytes | None:
    """The payload of an entry, or None when it is damaged or of another format."""
    if len(blob) < _HEAD or not blob.startswith(MAGIC):
        return None
    digest = blob[len(MAGIC):len(MAGIC) + 32]
    n = int.from_bytes(blob[len(MAGIC) + 32:_HEAD], "little")
    payload = blob[_HEAD:]
    if len(payload) != n or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


class DiskCache:
    """Byte strings by string key in one folder (see the module docstring).

    Thread-safe; several processes may share the folder. Never raises on I/O: a cache
    that cannot be used reports it through :meth:`info` and behaves as empty.
    """

    def __init__(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES):
        self.path = os.path.abspath(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._problem: str | None = None  # None: not checked yet; "": usable
        self.hits = self.misses = self.damaged = self.stored = 0

    # -- safety ------------------------------------------------------------------------
    def _usable(self) -> bool:
        if self._problem is None:
            self._problem = self._check_folder()
            if self._problem:
                self._refuse(self._problem)
        return not self._problem

    def _check_folder(self) -> str:
        try:
            if not os.path.isdir(self.path):
                os.makedirs(self.path, mode=0o700, exist_ok=True)
                os.chmod(self.path, 0o700)
            st = os.stat(self.path)
        except OSError as e:
            return f"cannot create or read the folder: {e.strerror or e}"
        if not stat.S_ISDIR(st.st_mode):
            return "it is not a folder"
        return _unsafe(st, "the folder")

    def _refuse(self, why: str, where: str | None = None) -> None:
        self._problem = why
        log.warning("adaptive_eager: not using the compiled-region cache at %s: %s; running "
                    "without it (fix or remove it, or set ADAPTIVE_EAGER_CACHE_DIR)",
                    where or self.path, why)

    # -- the public API ----------------------------------------------------------------
    def entry_path(self, key: str) -> str:
        """Where ``key``'s entry lives (whether or not it exists)."""
        return os.path.join(self.path, _file_name(key))

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None (absent, damaged, or the cache is off).

        A hit marks the entry as recently used; a damaged entry is deleted.
        """
        with self._lock:
            if not self._usable():
                return None
            path = self.entry_path(key)
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except FileNotFoundError:
                self.misses += 1
                return None
            except OSError as e:  # a symlink (ELOOP) or unreadable: not ours to trust
                self._refuse(f"cannot open the entry safely: {e.strerror or e}", path)
                return None
            try:
                st = os.fstat(fd)
                problem = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else \
                    _unsafe(st, "the entry")
                if problem:
                    self._refuse(problem, path)
                    return None
                with os.fdopen(fd, "rb", closefd=False) as f:
                    blob = f.read()
                payload = _unpack(blob)
                if payload is None:
                    self.damaged += 1
                    log.debug("adaptive_eager cache: damaged entry %s deleted", path)
                    self._remove(path)
                    return None
                try:
                    os.utime(fd)  # last use, for eviction
                except OSError:
                    pass
                self.hits += 1
                return payload
            except OSError:
                self.misses += 1
                return None
            finally:
                os.close(fd)

    def put(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` (replacing what was there); True if stored.

        Written to a private temporary file in the folder and renamed into place, so a
        concurrent reader or writer never sees half an entry; then the least recently
        used entries are deleted while the folder holds more than ``max_bytes``.
        """
        blob = _pack(data)
        if len(blob) > self.max_bytes:
            return False
        with self._lock:
            if not self._usable():
                return False
            tmp = None
            try:
                fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=self.path)  # mode 0600
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                os.replace(tmp, self.entry_path(key))
                tmp = None
            except OSError as e:
                log.debug("adaptive_eager cache: cannot store an entry in %s: %s", self.path, e)
                return False
            finally:
                if tmp is not None:
                    self._remove(tmp)
            self.stored += 1
            self._evict(keep=self.entry_path(key))
            return True

    def discard(self, key: str) -> None:
        """Delete ``key``'s entry, if any (an entry that loaded but failed its checks)."""
        with self._lock:
            if self._usable():
                self._remove(self.entry_path(key))

    def info(self) -> CacheInfo:
        """Where the cache is, how many entries and bytes it holds, whether it is usable."""
        with self._lock:
            usable = self._usable()
            files = self._entries() if usable else []
            return CacheInfo(self.path, len(files), sum(size for _, size, _ in files), self.max_bytes,
                             usable, self._problem or "")

    def clear(self) -> int:
        """Delete every entry (and writers' leftovers); how many entries were deleted."""
        with self._lock:
            if not self._usable():
                return 0
            n = 0
            for path, _, _ in self._entries():
                n += self._remove(path)
            self._sweep_tmp(max_age_s=0.0)
            return n

    # -- internals ---------------------------------------------------------------------
    def _entries(self) -> list[tuple[str, int, float]]:
        """(path, size, mtime) of each entry in the folder."""
        out = []
        try:
            with os.scandir(self.path) as it:
                for e in it:
                    if e.name.endswith(SUFFIX) and not e.name.startswith("."):
                        try:
                            st = e.stat(follow_symlinks=False)
                        except OSError:
                            continue  # deleted meanwhile by another process
                        out.append((e.path, st.st_size, st.st_mtime))
        except OSError:
            pass
        return out

    def _evict(self, keep: str) -> None:
        files = self._entries()
        total = sum(size for _, size, _ in files)
        if total > self.max_bytes:
            for path, size, _ in sorted(files, key=lambda f: f[2]):  # least recently used first
                if total <= self.max_bytes:
                    break
                if path != keep and self._remove(path):
                    total -= size
        self._sweep_tmp(_STALE_TMP_S)

    def _sweep_tmp(self, max_age_s: float) -> None:
        now = time.time()
        try:
            with os.scandir(self.path) as it:
                for e in it:
                    if e.name.startswith(_TMP_PREFIX):
                        try:
                            if now - e.stat(follow_symlinks=False).st_mtime >= max_age_s:
                                os.unlink(e.path)
                        except OSError:
                            pass
        except OSError:
            pass

    @staticmethod
    def _remove(path: str) -> int:
        try:
            os.unlink(path)
            return 1
        except OSError:  # another process deleted it first
            return 0


# Note [One cache object per folder]
# A documented registry: every session of a process that names the same folder shares one
# DiskCache, so a refused folder warns once per process, not once per session.
_OPEN: dict[tuple[str, int], DiskCache] = {}
_OPEN_LOCK = threading.Lock()


def open_cache(path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> DiskCache:
    """The process's :class:`DiskCache` for ``path`` (created on first use)."""
    key = (os.path.abspath(path), max_bytes)
    with _OPEN_LOCK:
        cache = _OPEN.get(key)
        if cache is None:
            cache = _OPEN[key] = DiskCache(path, max_bytes)
        return cache


__all__ = ["DiskCache", "CacheInfo", "open_cache", "default_dir", "resolve_dir", "DEFAULT_MAX_BYTES"]
