"""A worker process that dies with its supervisor.

supervisord starts each program in a process group of its own, so a supervisor killed
outright (`kill -9`, the OOM killer, a closed terminal after Ctrl-C) leaves its children
running: a device worker found alive 40 minutes later, and a second `make run` then ran
two workers under one device id (issue 41, finding 14). Linux's PR_SET_PDEATHSIG has the
kernel signal a process when its parent dies; SIGKILL, because a worker left without its
supervisor must not finish anything: what it held is unacked and comes back, as after
any `kill -9`. Written here with ctypes (one system call; no package wraps just this).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: <linux/prctl.h>
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits. Returns False
    where that cannot be asked (not Linux). A parent that died before the call leaves
    this process orphaned already: it signals itself at once."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def main(argv: list[str]) -> None:
    """`python -m dynamic_batching.core.lifetime CMD ...`: become CMD, dying with this
    process's parent. The setting survives execve, so a program that is not ours (Redis,
    gunicorn, Flower) dies with the supervisor that started it too."""
    if not argv:
        sys.exit("usage: python -m dynamic_batching.core.lifetime COMMAND [ARG ...]")
    die_with_parent()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
