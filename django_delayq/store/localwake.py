"""Wake-ups between the processes of one machine, where the database has no NOTIFY.

SQLite is a file, so the programs that write it and the workers that read it
run on the machine that holds it. Each idle worker binds a Unix datagram
socket in a directory named after the database file; a transaction that
enqueued sends one datagram (the body a NOTIFY would carry: queue and due
time) to every socket there when it commits, through Django's ``on_commit``,
so a rollback wakes nobody. Without this a worker on SQLite learns of a new
message only at its next poll, seconds later.

A datagram is sent without waiting: a worker whose socket buffer is full has
wake-ups queued already. A socket nobody reads any more (its worker was
killed) refuses the datagram, and the sender that finds it so removes it.
Polling stays the floor: a writer that sends nothing (another program, a
process whose temporary directory differs) is found by the next poll, as
before.

The directory lives in the temporary directory, is the user's own (mode
0700, checked), and is keyed by the database file's real path, so two
projects on one machine never wake each other.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import socket
import stat
import tempfile
import uuid
from functools import partial
from pathlib import Path

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_delayq.worker")

# A Unix socket's path must fit sockaddr_un's sun_path (108 bytes on Linux,
# 104 on macOS), with the file name.
MAX_PATH = 100


def directory(connection: BaseDatabaseWrapper) -> Path | None:
    """The wake-up directory of ``connection``'s SQLite file, or None (in memory,
    no Unix sockets, a path too long for one)."""
    if not hasattr(socket, "AF_UNIX"):  # pragma: no cover - Windows
        return None
    name = connection.settings_dict.get("NAME")
    in_memory = getattr(connection, "is_in_memory_db", lambda: True)
    if not name or in_memory():
        return None
    return _directory_of(str(name))


@functools.cache
def _directory_of(name: str) -> Path | None:
    """Computed once per database file (each enqueue asks)."""
    digest = hashlib.sha256(os.path.realpath(name).encode()).hexdigest()[:16]
    found = Path(tempfile.gettempdir()) / f"django-delayq-{os.getuid()}-{digest}"
    if len(str(found)) + 24 > MAX_PATH:
        return None
    return found


def _is_ours(path: Path) -> bool:
    """Whether ``path`` is a directory of this user's that only this user can write."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def send(where: Path, body: bytes) -> int:
    """Send ``body`` to every worker socket in ``where``; how many took it."""
    try:
        if not _is_ours(where):
            return 0
        with os.scandir(where) as found:
            entries = [e for e in found if e.name.endswith(".sock")]
    except OSError:
        return 0
    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for entry in entries:
            try:
                sender.sendto(body, entry.path)
                sent += 1
            except ConnectionRefusedError:
                # Bound by a process that is gone: nobody will read it again.
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            except OSError:
                pass  # a full buffer (that worker is awake already), a race with its exit
    return sent


def _has_sockets(where: Path) -> bool:
    try:
        with os.scandir(where) as entries:
            return any(entry.name.endswith(".sock") for entry in entries)
    except OSError:
        return False


def on_commit(connection: BaseDatabaseWrapper, body: str) -> None:
    """Wake the local workers when ``connection``'s transaction commits (at once
    in autocommit: what was written is committed already).

    Nothing is registered while no worker waits (no socket): a worker that
    starts before the commit claims what is due when it starts.
    """
    where = directory(connection)
    if where is not None and _has_sockets(where):
        transaction.on_commit(partial(send, where, body.encode()), using=connection.alias)


class Receiver:
    """A worker's socket in the wake-up directory; ``fileno`` for ``select``."""

    def __init__(self, where: Path) -> None:
        where.mkdir(mode=0o700, exist_ok=True)
        if not _is_ours(where):
            raise PermissionError(f"{where} is not a private directory of this user's")
        self.path = where / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._socket.bind(str(self.path))
            self._socket.setblocking(False)
        except OSError:
            self._socket.close()
            raise

    def fileno(self) -> int:
        return self._socket.fileno()

    def drain(self) -> list[bytes]:
        """The datagrams that have arrived, without waiting for more."""
        bodies = []
        while True:
            try:
                bodies.append(self._socket.recv(4096))
            except (BlockingIOError, InterruptedError):
                return bodies
            except OSError:
                return bodies

    def close(self) -> None:
        self._socket.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
