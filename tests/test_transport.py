"""gloo's socket threads may take a rank's core when they wake only while it computes (harness/transport.py):
at every post they run as SCHED_BATCH, in every computation as SCHED_OTHER, as observed apart from the harness."""

import re
import sys

import pytest

from tests.launch import SIZE, launch, program, variant

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scheduling policies are Linux's")


def policies(tmp_path, prepend=""):
    """(socket threads, posts seen at SCHED_BATCH, posts, computing notes at SCHED_OTHER, computing notes) of rank 0
    of 03 on 2 ranks."""
    script = variant(tmp_path, "03_1f1b.py", program("socket_threads") + prepend)
    run = launch(tmp_path, script, 2, *SIZE, "--micro-batches", "4")
    found = re.search(r"socket threads (\d+) posts (\d+)/(\d+) computing (\d+)/(\d+)", run.stdout)
    assert found, run.stdout
    return tuple(int(number) for number in found.groups())


def test_socket_threads_yield_outside_computations(tmp_path):
    threads, batch, posts, other, computing = policies(tmp_path)
    assert threads >= 1 and posts > 0 and computing > 0
    assert (batch, other) == (posts, computing)


def test_without_it_they_do_not(tmp_path):
    """With the switch made a no-op, the posts see the socket threads as SCHED_OTHER: the test above can fail."""
    threads, batch, posts, _, _ = policies(tmp_path, "import harness.transport\n"
                                                     "harness.transport._set = lambda policy: None\n")
    assert threads >= 1 and batch == 0 < posts
