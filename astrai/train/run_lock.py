"""One process owns a run directory: `RUN/.lock`, held while a run trains in it.

    with hold_run(run_dir, "astrai train"):   # RunInUse (one line, exit 2) if another has it
        ...
    probe_run(run_dir)                        # the same check, let go at once (the launcher)

The lock is flock(2) `LOCK_EX | LOCK_NB` on `RUN/.lock`, a file holding one JSON line that
names the holder (pid, host, command, start time) for the message of whoever is refused.
The kernel drops an flock when its process dies, even by `kill -9`, so the lock of a dead
run is simply free: there is no stale lock to delete by hand. The file stays when the run
ends (deleting it while another process has it open would let two processes lock two
different files). Under torch distributed only global rank 0 writes the run directory, so
only it takes the lock (docs/distributed.md). Linux and macOS; without fcntl (Windows)
nothing is locked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from astrai.errors import AstraiError

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"


class RunInUse(AstraiError):
    """Another live process trains in this run directory."""


@dataclass
class RunLock:
    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = None


def describe_holder(text: str) -> str:
    """`pid 4242 on node1, astrai train since 2025-01-02 10:11:12` from the lock's JSON line
    (the holder may not have written it yet)."""
    try:
        info = json.loads(text)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {int(info['pid'])} on {info['host']}, {info['command']} since {since}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def _refused(run_dir: Path, fd: int) -> RunInUse:
    who = describe_holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
    return RunInUse(f"{run_dir}: in use by another run ({who}); a run directory belongs to one "
                    "process: wait for it to finish or stop it, or use another directory")


def acquire(run_dir: str | Path, command: str, *, record: bool = True) -> RunLock:
    """Lock `run_dir` (an existing directory) for this process, or raise RunInUse naming
    the holder. `record`: write this process into the lock file (False: a probe)."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    if fcntl is None:
        return RunLock(path, None)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # permissions of the umask
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            err = _refused(run_dir, fd)
            os.close(fd)
            raise err from None
        os.close(fd)  # a filesystem without flock: run unlocked, as before locks existed
        return RunLock(path, None)
    if record:
        line = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "command": command, "since": round(time.time(), 3)}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode(), 0)
    return RunLock(path, fd)


def probe_run(run_dir: str | Path) -> None:
    """Raise RunInUse if a live process holds `run_dir`; nothing is created or kept."""
    if (Path(run_dir) / LOCK_NAME).is_file():
        acquire(run_dir, "probe", record=False).release()


@contextlib.contextmanager
def hold_run(run_dir: str | Path, command: str) -> Iterator[RunLock]:
    """Hold the lock of `run_dir` for the block."""
    lock = acquire(run_dir, command)
    try:
        yield lock
    finally:
        lock.release()
