"""Who wrote a temp file: the owner is recorded in its name, so clean-up deletes only what a dead writer left.

A temp name is `<target>.tmp-<machine>-<pid>-<start>-<random>`: `machine` is a short hash of the host name and the
boot id (a reboot makes every earlier pid stale), `start` the writer's start time in clock ticks since boot (from
/proc; it tells a reused pid apart). A temp file is provably orphaned only when it was written on this machine in
this boot and that pid is gone or now belongs to a process that started at another time. Temp files of other
machines (a shared filesystem) and names without an owner (written by an older release) are left alone: nothing
proves their writer is gone.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import uuid
from functools import lru_cache

TMP_MARKER = ".tmp-"
_OWNED = re.compile(r"\.(?:tmp|data)-(?P<machine>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]+(?:$|[.-])")


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def machine_id() -> str:
    """8 hex digits naming this host in this boot."""
    return hashlib.sha256(f"{socket.gethostname()}|{_boot_id()}".encode()).hexdigest()[:8]


def process_start(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot; None if it does not exist (or is a zombie); 0 where /proc
    is missing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    fields = stat[stat.rfind(b")") + 2:].split()  # the command name may hold spaces and parentheses
    if fields[0] in (b"Z", b"X"):  # a zombie writes nothing: its writer is gone
        return None
    return int(fields[19])  # field 22 of stat(5), counted after the name


def owner_tag(pid: int | None = None) -> str:
    """`<machine>-<pid>-<start>-<random>` for this process (or `pid`, a process of this machine)."""
    pid = os.getpid() if pid is None else pid
    start = process_start(pid) or 0
    return f"{machine_id()}-{pid}-{start}-{uuid.uuid4().hex[:8]}"


def temp_name(name: str) -> str:
    """The name of a temp file for `name`, owned by this process."""
    return f"{name}{TMP_MARKER}{owner_tag()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def owner_is_gone(tag: str) -> bool:
    """`writer_is_gone` for a bare owner tag (as `owner_tag` returns it)."""
    return writer_is_gone(f"{TMP_MARKER}{tag.strip()}")


def writer_is_gone(name: str) -> bool:
    """True only when the owner recorded in the temp name `name` provably no longer runs, or is this process:
    clean-up runs when a fit starts, with no save of its own in flight, so its own temp files are leftovers."""
    found = _OWNED.search(name)
    if found is None or found["machine"] != machine_id():
        return False
    pid, start = int(found["pid"]), int(found["start"])
    if pid == os.getpid():
        return True
    now = process_start(pid)
    if now is None:
        return True if os.path.isdir("/proc/self") else not _pid_alive(pid)
    return start != 0 and now != 0 and now != start
