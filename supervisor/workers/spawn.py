"""Starting and reaping worker processes, without multiprocessing.

A worker is a fresh interpreter the supervisor spawns itself (`os.posix_spawn`, a vfork
and an exec: cheap whatever the supervisor's size), so the supervisor is its parent and
PDEATHSIG points at it; no forkserver or resource tracker stands in between and outlives
it. The two talk over a socket pair: the supervisor keeps the only copy of its end
(close-on-exec, so no other worker inherits it), which is what lets a worker notice the
supervisor's death at once. The process's exit is watched through a pidfd and its status
collected with `waitpid`, so an exit code or the real signal can be named.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from goqueue.actors.tracebacks import DEFAULT_MAX_TRACEBACK_BYTES

if TYPE_CHECKING:
    from goqueue.supervisor.settings.config import Settings

CHILD_FD = 3  # the worker's end of the pipe, as the child sees it
# Signals a child must not inherit as ignored or blocked (exec resets only handled ones).
_RESET = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGPIPE,
    signal.SIGCHLD,
)
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a new worker boots with: the actor modules, the directories put first on its
    import path, the largest result it may return (None: no limit), the most of a
    failed attempt's traceback it sends, its log level, and the resident memory past
    which it is to be recycled (it then starts none of the attempts queued on it)."""

    modules: tuple[str, ...]
    paths: tuple[str, ...] = ()
    max_result_bytes: int | None = None
    max_traceback_bytes: int = DEFAULT_MAX_TRACEBACK_BYTES
    log_level: str = "info"
    otel: bool = False
    node: str = ""
    max_rss_kb: int | None = None

    @classmethod
    def of(cls, settings: Settings) -> WorkerConfig:
        """What `settings` ask for: the working directory, then each `--path`, first on
        the import path (so `cd project && goqueue serve --actors app.tasks` works)."""
        cwd = os.getcwd()
        paths = (cwd, *(os.path.join(cwd, p) for p in settings.path or ()))
        return cls(
            tuple(settings.actors),
            paths,
            settings.max_result_bytes,
            settings.max_traceback_bytes,
            settings.log_level,
            settings.otel,
            settings.node_id,
            settings.max_worker_rss_mb * 1024 if settings.max_worker_rss_mb else None,
        )


@dataclass(frozen=True, slots=True)
class Launched:
    """A process just started: its pid, a pidfd readable once it exits, our pipe end."""

    pid: int
    pidfd: int
    sock: socket.socket


def launch(environ: Mapping[str, str] | None = None) -> Launched:
    """Spawn `python -m goqueue.actors.child` as a child of this process. Raises OSError
    (EMFILE, ENOMEM, EAGAIN, ...) with nothing left open or running."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = _spawn(theirs.fileno(), os.environ if environ is None else environ)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    try:
        pidfd = os.pidfd_open(pid)
    except BaseException:  # no way to watch it: do not leave it running unwatched
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        ours.close()
        raise
    return Launched(pid, pidfd, ours)


def _spawn(fd: int, environ: Mapping[str, str]) -> int:
    argv = _argv(os.getpid())
    if fd == CHILD_FD:  # dup2 onto itself would keep close-on-exec set
        os.set_inheritable(fd, True)
        actions: Sequence[tuple[int, int, int]] = ()
    else:
        actions = ((os.POSIX_SPAWN_DUP2, fd, CHILD_FD),)
    return os.posix_spawn(
        sys.executable,
        argv,
        environ,
        file_actions=actions,
        setsigmask=(),
        setsigdef=_RESET,
    )


def _argv(supervisor: int) -> list[str]:
    # -u: nothing written below the worker's line capture waits in a buffer; -P: nothing
    # from the working directory shadows what the worker imports to boot (Boot.paths
    # adds it afterwards)
    return [
        sys.executable,
        "-u",
        "-P",
        "-m",
        "goqueue.actors.child",
        str(CHILD_FD),
        str(supervisor),
    ]


def reap(pid: int) -> tuple[bool, int | None]:
    """Collect a child's status if it exited: (True, its exit code or minus the signal
    that killed it); (False, None) while it runs; (True, None) if it was reaped
    elsewhere, its status lost."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True, None
    return (True, os.waitstatus_to_exitcode(status)) if done else (False, None)


def open_statm(pid: int) -> int:
    """A descriptor on /proc/PID/statm, re-read with `rss_kb` (no open per sample)."""
    return os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)


def rss_kb(statm_fd: int) -> int:
    """Resident memory in KiB, read fresh through a descriptor from `open_statm`; 0 once
    the process is gone."""
    try:
        fields = os.pread(statm_fd, 128, 0).split()
    except OSError:
        return 0
    return int(fields[1]) * _PAGE_KB if len(fields) > 1 else 0
