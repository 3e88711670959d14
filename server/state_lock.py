"""One run per state directory: an exclusive lock that ``lorm-server`` holds for its whole life, and the in-process
engine (``lorm-sim --state-dir``, each ``lorm-bench`` cell) while its run lasts.

Two coordinators writing one run's state would corrupt it (each resumes the same generation and writes the next),
so the process that serves a state directory first takes ``<state dir>/coordinator.lock`` with ``flock``, and a
second process given the same directory refuses to start. The lock is the kernel's: it is freed when its holder
exits however it exits (a crash, SIGKILL, a container stopped), so a restarted coordinator takes it at once, with
no stale file to clean. The file holds the holder's pid and host, for the refusal's message only. ``flock`` locks
are per host: a state directory on a network file system shared by coordinators on several hosts is guarded only
where the file system passes them on (NFS v4 does).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "coordinator.lock"


class StateDirHeld(RuntimeError):
    """Another running process (or, for the engine, another run of this one) holds the state directory."""


def hold(state_dir: str | Path) -> int:
    """Take ``state_dir``'s lock (the directory made if missing) for this process, or raise :class:`StateDirHeld`
    naming its holder. Returns the lock file's descriptor: the lock lasts while it is open, so keep it (the
    process's end closes it)."""
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "unknown"
        os.close(fd)
        raise StateDirHeld(
            f"state directory {root} is held by a running coordinator or engine ({holder}): stop it first, or "
            f"give this run its own state directory"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


@contextlib.contextmanager
def held(state_dir: str | Path | None) -> Iterator[None]:
    """:func:`hold` for a block (nothing when ``state_dir`` is ``None``), the lock freed when it ends."""
    fd = hold(state_dir) if state_dir is not None else None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)
