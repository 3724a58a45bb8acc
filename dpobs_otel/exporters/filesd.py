"""Prometheus file_sd registration: one JSON file per process, written atomically (a
half-written file would make Prometheus drop the target) and removed on shutdown or exit.

A process killed with SIGKILL cannot remove its file, so every file also says whether its
writer still lives, without adding a label to any series: the writer holds an exclusive
flock(2) on the file for its whole life, and the kernel drops that lock when the process
dies, however it dies. A lock means something only to processes under the same kernel, so
the file name carries the kernel's boot id (`<name>@<boot id>.<start>.json`); a cleaner
judges only files of its own boot. The lock works across PID namespaces (a Kubernetes
sidecar sees none of its pod's other containers' processes, but shares their kernel),
where a pid in the name would not. `<start>` (the writer's start time in clock ticks since
boot) makes the name unique to one process for the life of the boot, so a reused pid can
never pick up or overwrite an old file. Children forked by the process (data loader
workers) share the locked descriptor, so a file outlives its writer while they live: kept
too long, never removed too early.

A target that several processes announce (TransferQueue's controller, which every process of
its job sees) is a SharedFileSDTarget: one name for all of them, `<name>@<boot id>.0.json`,
each announcer holding a shared lock; the same sweep removes it once none is left.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import json
import logging
import os
import re
import tempfile
import time

log = logging.getLogger("dpobs_otel")

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
# `<anything>@<12 hex>.<digits>.json`: the part a cleaner can judge.
_OWNED = re.compile(r"@(?P<boot>[0-9a-f]{12})\.(?P<start>[0-9]+)\.json$")
_TMP_PREFIX = ".dpobs-"


def boot_id() -> str | None:
    """The first 12 hex digits of this kernel's boot id, or None off Linux."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip().replace("-", "")[:12] or None
    except OSError:
        return None


def start_ticks(pid: int | str = "self") -> int | None:
    """A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _identity() -> str | None:
    boot, start = boot_id(), start_ticks()
    return None if boot is None or start is None else f"@{boot}.{start}"


class FileSDTarget:
    def __init__(self, sd_dir: str, target: str, labels: dict[str, str], name: str):
        os.makedirs(sd_dir, exist_ok=True)
        sweep(sd_dir)  # files of processes that died without removing them
        ident = _identity()
        self.path = os.path.join(sd_dir, f"{name}{ident or ''}.json")
        doc = [{"targets": [target], "labels": {k: str(v) for k, v in labels.items()}}]
        fd, tmp = tempfile.mkstemp(dir=sd_dir, prefix=_TMP_PREFIX, suffix=".tmp")
        self._lock_fd = None
        try:
            if ident is not None and _try_lock(fd):
                self._lock_fd = os.dup(fd)  # the lock lives as long as this descriptor
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=2, sort_keys=True)
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; Prometheus often runs as another user
            os.replace(tmp, self.path)  # Prometheus sees the old file or the whole new one
        except BaseException:
            os.unlink(tmp)
            self._close_lock()
            raise
        if ident is not None and self._lock_fd is None:
            log.debug("dpobs: %s cannot hold a lock here; it will not be swept", self.path)
        atexit.register(self.remove)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._close_lock()  # after the unlink: a cleaner never sees this file unlocked
        atexit.unregister(self.remove)

    def _close_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


class SharedFileSDTarget:
    """One target announced by any number of processes, one file whoever writes it.

    The first announcer creates the file whole (a complete temporary, link(2)ed into place:
    link never replaces, so a second writer joins the first file instead of swapping in an
    inode of its own); every announcer holds a shared flock on that file for its life. The
    sweep (which needs the exclusive lock) removes it only once no announcer is left,
    however they went; the last one out removes it itself. `<start>` in the name is 0: the
    file belongs to no one process."""

    ATTEMPTS = 8  # joins lost to a sweep removing the file at that moment, then retried

    def __init__(self, sd_dir: str, target: str, labels: dict[str, str], name: str):
        os.makedirs(sd_dir, exist_ok=True)
        sweep(sd_dir)  # a file whose announcers are all gone goes first
        boot = boot_id()
        self.path = os.path.join(sd_dir, f"{name}@{boot}.0.json" if boot else f"{name}.json")
        doc = [{"targets": [target], "labels": {k: str(v) for k, v in labels.items()}}]
        self._pid = os.getpid()
        self._fd = None
        for attempt in range(self.ATTEMPTS):
            time.sleep(0.001 * attempt)  # a reader's probe holds the lock for an instant
            self._fd = _join(self.path)
            if self._fd is None:
                self._fd = _create(self.path, sd_dir, doc)
            if self._fd is not None:
                break
        else:
            raise OSError(f"could not announce {self.path}: it kept disappearing")
        atexit.register(self.remove)

    def remove(self, force: bool = False) -> None:
        """Stop announcing: the file goes if this was the last announcer, or (force: the
        target itself is gone) whoever else still announces it."""
        fd, self._fd = self._fd, None
        atexit.unregister(self.remove)
        if fd is None:
            return
        try:  # a forked child only drops its copy: the lock is its parent's too
            if os.getpid() == self._pid and (force or _try_lock(fd)) and _names(self.path, fd):
                _unlink(self.path)
        finally:
            os.close(fd)


def _join(path: str) -> int | None:
    """A descriptor of the existing file at path, shared-locked; None when there is none
    (or a sweep holds it, about to remove it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        if _names(path, fd):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _create(path: str, sd_dir: str, doc) -> int | None:
    """The file at path, written whole and shared-locked; None when another announcer
    created it first (join that one)."""
    fd, tmp = tempfile.mkstemp(dir=sd_dir, prefix=_TMP_PREFIX, suffix=".tmp")
    try:
        with os.fdopen(os.dup(fd), "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
        os.chmod(tmp, 0o644)  # as FileSDTarget: Prometheus often runs as another user
        fcntl.flock(fd, fcntl.LOCK_SH)  # before the name appears: never seen unlocked
        try:
            os.link(tmp, path)
        except FileExistsError:
            os.close(fd)
            return None
        except OSError:  # a filesystem without hard links: the old way, still atomic
            os.replace(tmp, path)
        return fd
    except BaseException:
        os.close(fd)
        raise
    finally:
        _unlink(tmp)


def _try_lock(fd: int) -> bool:
    """Take an exclusive lock without waiting. False when another process holds it, or the
    filesystem cannot lock (then nobody can judge the file, and it is kept)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            log.debug("dpobs: flock failed: %s", exc)
        return False


def sweep(sd_dir: str, node_local: bool = False) -> list[str]:
    """Remove the file_sd files in sd_dir whose writer is gone; returns their paths.

    A file of this boot is gone when nobody holds its lock. A file of another boot is
    judged only when `node_local` says the directory belongs to this machine (the agent's
    directory: then a file from an earlier boot is certainly stale); on a shared filesystem
    it may belong to a live process on another host. Files without an identity (other
    tools, or filesystems without locks) are never touched. Never raises."""
    me = boot_id()
    if me is None:
        return []
    removed = []
    try:
        entries = os.listdir(sd_dir)
    except OSError:
        return []
    for entry in entries:
        m = _OWNED.search(entry)
        if m is None:
            continue
        path = os.path.join(sd_dir, entry)
        if m["boot"] != me:
            if node_local and _unlink(path):
                removed.append(path)
        elif _remove_if_unlocked(path):
            removed.append(path)
    removed += _sweep_temporaries(sd_dir, entries)
    return removed


def _remove_if_unlocked(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # already gone
    try:
        if not _try_lock(fd):
            return False  # its writer lives (or nobody can tell)
        # Holding the lock, remove the name only if it still names the inode we locked.
        return _names(path, fd) and _unlink(path)
    finally:
        os.close(fd)


def _names(path: str, fd: int) -> bool:
    """Does `path` still name the file open as `fd` (not a newer file of the same name)?"""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _sweep_temporaries(sd_dir: str, entries: list[str]) -> list[str]:
    """A writer killed between mkstemp and rename leaves `.dpobs-*.tmp`; its lock is gone
    too. (A temporary that was never locked is at most one write old: left alone.)"""
    out = []
    for entry in entries:
        if entry.startswith(_TMP_PREFIX) and entry.endswith(".tmp"):
            path = os.path.join(sd_dir, entry)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                # Unlocked and non-empty: its writer wrote, then died before the rename.
                if os.fstat(fd).st_size > 0 and _try_lock(fd) and _unlink(path):
                    out.append(path)
            finally:
                os.close(fd)
    return out


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
