"""gloo's socket threads beside a rank's own: when they may take its core.

Each gloo process group moves its messages on a thread of its own, `gloo_tcp_loop`, on the cores
before_setup gives the rank. That thread must take the core at once when a peer asks for a send
that waits for its receive, which it can while the rank computes. But when it wakes while the rank
posts a send or a receive, it finds the link locked by the posting (gloo's Pair::handleEvents only
tries the lock) and, its socket still readable, polls again at once: it holds the core until the
scheduler takes it back, and a post of microseconds lasts milliseconds. So outside computations it
runs as SCHED_BATCH, which never takes the core from a running thread when it wakes, and within them
as SCHED_OTHER, as before. Linux only; where there is no such thread (NCCL), nothing changes.
"""

import os

_LOOP = "gloo_tcp_loop"  # the name gloo gives each group's socket thread
_threads = None  # this process's, found at the first step: every group exists by then
_depth = 0  # computations open (a computation's span may hold another's)


def step_begins():
    """A step begins, outside any computation (its first post may come before its first computation)."""
    _set(os.SCHED_BATCH)


def computing(began):
    """A computation began (True) or ended (False): gloo's socket threads may take the core when they wake only
    while one runs (the outermost, where one computation's span holds another's)."""
    global _depth
    _depth += 1 if began else -1
    if _depth == (1 if began else 0):
        _set(os.SCHED_OTHER if began else os.SCHED_BATCH)


def _set(policy):
    for thread in list(_socket_threads()):
        try:
            os.sched_setscheduler(thread, policy, os.sched_param(0))
        except OSError:  # the thread has ended with its group
            _threads.remove(thread)


def _socket_threads():
    global _threads
    if _threads is None:
        _threads = []
        if hasattr(os, "sched_setscheduler") and os.path.isdir("/proc/self/task"):
            for thread in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{thread}/comm") as file:
                        name = file.read().strip()
                except OSError:  # ended meanwhile
                    continue
                if name == _LOOP:
                    _threads.append(int(thread))
    return _threads
