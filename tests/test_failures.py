"""Bad input, mismatched ranks, dead and stuck ranks: one sentence, a non-zero exit, in
bounded time, nothing left running. A script started with plain python says how to start
ranks; the two deadlocks gloo hides (1F1B's pairs split, a receive posted too early) end
with the timeout sentence under --sync-sends. And the same flags always give bitwise the
same losses, on one node or two (a two-node launch on one host is one 4-rank run)."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.launch import (
    ENV,
    HERE,
    SIZE,
    SYNC,
    assert_one_sentence,
    deadlocks_under_sync_sends,
    pipelined,
    program,
    python,
    run_quietly,
    torchrun,
    two_nodes,
)


@pytest.mark.parametrize("flags,words", [
    (("--micro-batches", "0"), ("--micro-batches", "between 1 and")),
    (("--micro-batches", "257"), ("--micro-batches", "256")),
    (("--layers", "0"), ("--layers",)),
    (("--steps", "-2"), ("--steps",)),
    (("--lr", "0"), ("--lr",)),
    (("--dtype", "float16"), ("--dtype", "float16")),
    (("--hidden", "wide"), ("--hidden", "wide")),
    (("--micro-batchs", "4"), ("--micro-batchs",)),
    (("--trace", "run.json", "--no-instrument"), ("--trace", "--no-instrument")),
    (("--dump-grads", "README.md"), ("--dump-grads", "not a folder")),
    (("--trace", "no/such/folder/run.json"), ("--trace", "does not exist")),
    (("--overhead", "--no-instrument"), ("--overhead", "--no-instrument")),
    (("--overhead", "--steps", "2"), ("--overhead", "--steps 3")),
    (("--pace", "-1"), ("--pace", "between 0")),
    (("--svg", "no/such/folder/run.svg"), ("--svg", "does not exist")),
])
def test_bad_flag(flags, words):
    started = time.monotonic()
    result = python("03_1f1b.py", *flags, timeout=60)
    assert_one_sentence(result, *words)
    assert time.monotonic() - started < 30


def test_more_ranks_than_layers():
    result, seconds = run_quietly(torchrun(4, "02_gpipe.py", "--layers", "3"))
    assert_one_sentence(result, "4 ranks", "3 layers")
    assert seconds < 30


def test_baseline_refuses_torchrun():
    result, _ = run_quietly(torchrun(2, "00_baseline.py"))
    assert_one_sentence(result, "python")


def test_two_nodes_train_like_one(runs, tmp_path):
    flags = SIZE + ("--micro-batches", "4", "--json")
    (code0, out0, err0), (code1, _, err1) = two_nodes("03_1f1b.py", flags, flags)
    assert code0 == code1 == 0, err0 + err1
    summary = [line for line in out0.splitlines() if line.startswith("{")]
    two = json.loads(summary[0])
    one = pipelined(runs, "03_1f1b.py", 4, 4, *SYNC).summary  # the waits differ, the arithmetic does not
    assert two["world_size"] == 4 and two["losses"] == one["losses"]


def test_ranks_with_different_flags():
    (code0, _, err0), (code1, _, err1) = two_nodes(
        "02_gpipe.py", SIZE + ("--micro-batches", "4"), SIZE + ("--micro-batches", "4", "--hidden", "32"))
    assert code0 != 0 and code1 != 0
    errors = [line for line in (err0 + err1).splitlines() if line.startswith("error:")]
    assert errors and all("--hidden on ranks 2, 3" in line for line in errors), err0 + err1


def test_same_flags_same_losses(runs):
    first = pipelined(runs, "03_1f1b.py", 2, 3, *SYNC).summary["losses"]
    result, _ = run_quietly(torchrun(2, "03_1f1b.py", *SIZE, "--micro-batches", "3", *SYNC, "--json"))
    again = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert json.loads(again[0])["losses"] == first


def ranks_of(launcher):
    """{rank: pid} of the workers a torchrun process started."""
    children = {}
    for pid in subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split():
        with open(f"/proc/{pid}/environ", "rb") as file:
            env = dict(item.split(b"=", 1) for item in file.read().split(b"\0") if b"=" in item)
        children[int(env[b"RANK"])] = int(pid)
    return children


def start_training(marker, *flags):
    """A long run; returns once every rank has started stepping."""
    launcher = subprocess.Popen(torchrun(4, "03_1f1b.py", *SIZE, "--steps", "100000", "--trace", marker, *flags),
                                cwd=HERE, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = launcher.stdout.readline()
    while line.startswith("note:"):  # ranks that share cores say so first
        line = launcher.stdout.readline()
    assert "step" in line, line
    return launcher


def leftovers(marker):
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [pid for pid in found if int(pid) != os.getpid()]


def test_killed_rank_stops_everyone(tmp_path):
    marker = str(tmp_path / "killed.json")
    launcher = start_training(marker, "--timeout", "20")
    os.kill(ranks_of(launcher)[2], signal.SIGKILL)
    started = time.monotonic()
    launcher.communicate(timeout=60)
    assert launcher.returncode != 0 and time.monotonic() - started < 20
    time.sleep(1)
    assert leftovers(marker) == []


def test_stuck_rank_times_out(tmp_path):
    """A rank that stops answering: its neighbours give up after --timeout and say whom they waited for."""
    marker = str(tmp_path / "stuck.json")
    launcher = start_training(marker, "--timeout", "3")
    stuck = ranks_of(launcher)[2]
    os.kill(stuck, signal.SIGSTOP)
    started = time.monotonic()
    try:
        line = launcher.stderr.readline()
        while line and not line.startswith("error:"):
            line = launcher.stderr.readline()
        waited = time.monotonic() - started
    finally:  # torchrun would give a stopped process 30 s to answer its SIGTERM
        os.kill(stuck, signal.SIGKILL)
    launcher.communicate(timeout=60)
    assert launcher.returncode != 0
    # whoever times out first speaks: rank 1 or 3 waiting for rank 2, or rank 0 waiting for rank 1
    match = re.match(r"error: rank (\d) gave up in (\w+) \(micro-batch \d+\) waiting for rank (\d)", line)
    assert match and abs(int(match[1]) - int(match[3])) == 1, line
    # --timeout counts from the start of the wait, which may begin a moment before rank 2 is stopped (one run here
    # gave up 2.996 s after the stop): half a second of it is allowed, far less than the 3 s a wait that ignored
    # --timeout would miss by
    assert 2.5 <= waited < 20, waited
    time.sleep(1)
    assert leftovers(marker) == []


def test_without_torchrun_says_how_to_start_ranks(runs):
    run = runs("03_1f1b.py", 0, *SIZE, "--micro-batches", "3")
    assert "torchrun --nproc_per_node=4 03_1f1b.py" in run.stderr


def test_sync_sends_catches_a_deadlock(tmp_path):
    """Under NCCL's rules two neighbours that both send first wait for each other forever:
    --sync-sends must turn that into the timeout sentence, where gloo's own rules let it pass."""
    errors = deadlocks_under_sync_sends(tmp_path, "03_1f1b.py", program("split_pairs"),
                                        SIZE + ("--micro-batches", "4"))
    assert "gave up in send_" in errors[0] and "waiting for rank" in errors[0], errors


def test_sync_sends_catches_a_receive_posted_too_early(tmp_path):
    """On NCCL a rank's sends and receives run in the order posted, so a receive posted ahead holds back
    every later send until its tensor arrives: here the activation that the gradient needs, forever.
    gloo lets the send overtake; --sync-sends must not."""
    errors = deadlocks_under_sync_sends(tmp_path, "01_naive.py", program("early_receive"), SIZE)
    assert any("gave up in recv_backward" in error and "waiting for rank 1" in error for error in errors), errors
