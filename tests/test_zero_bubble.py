"""Zero bubble (05): the baseline's gradients, W deferred as ZB-H1 says, I + W computing nothing
twice, and the memory that the deferred W's hold."""

import json

import pytest

import schedules
from tests.launch import MEMORY, SIZE, SYNC, assert_matches, case_ids, launch, pipelined, program, variant

SCRIPT = "05_zero_bubble.py"

# (world size, micro-batches, flags): 1 to 4 ranks; fewer, as many and more micro-batches than
# ranks; 3, 4 and 7 micro-batches of unequal size (10 samples); 7 layers, which 2, 3 and 4 ranks
# do not divide. Under --sync-sends a deadlock would stop the run.
CASES = [(1, 3, ()), (2, 3, SYNC), (3, 1, SYNC), (4, 2, ()), (3, 3, ()), (4, 4, SYNC), (4, 7, ()), (4, 7, SYNC)]


@pytest.fixture(scope="module")
def baseline(runs):
    return runs("00_baseline.py", 0, *SIZE)


@pytest.mark.parametrize("world,micro_batches,flags", CASES, ids=case_ids(CASES, "n", "m"))
def test_matches_baseline(runs, baseline, world, micro_batches, flags):
    run = pipelined(runs, SCRIPT, world, micro_batches, *flags)
    assert_matches(run, baseline)


@pytest.mark.parametrize("world,micro_batches,flags", CASES, ids=case_ids(CASES, "n", "m"))
def test_schedule_is_zb_h1(runs, world, micro_batches, flags):
    """Every rank runs F, I and W in ZB-H1's table (schedules.zb_h1), every step, and keeps min(n, m) in flight."""
    run = pipelined(runs, SCRIPT, world, micro_batches, *flags)
    spans = [e for e in run.trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "wait"]
    for rank in range(world):
        for step in range(3):
            mine = sorted((e for e in spans if e["pid"] == rank and e["args"]["step"] == step), key=lambda e: e["ts"])
            assert [(e["cat"], e["args"]["micro_batch"]) for e in mine] == [
                (kind, micro_batch) for kind, _, micro_batch in schedules.zb_h1(world, micro_batches)[rank]]
    inflight = min(world, micro_batches)
    assert run.summary["peak_inflight_microbatches"] == [inflight] * world
    assert run.summary["expected_inflight_microbatches"] == [inflight] * world


def test_held_bytes_are_the_theory(runs):
    """A micro-batch between F and I holds the stage's input and each block's ReLU output (L + 1
    tensors of rows x hidden); one between I and W holds each Linear's input and its output's
    gradient (2L). Stage r has at most min(r + 1, m) W's pending and min(n, m) in flight, so its
    peak is (min(n, m) - min(r + 1, m))(L + 1) + min(r + 1, m) 2L, plus at most 3 tensors in transit:
    a gradient received and one sent, and the output of the micro-batch whose I has just ended."""
    world, m, rows, hidden, blocks = 4, 8, 2, 24, 4
    summary = pipelined(runs, SCRIPT, world, m, size=MEMORY).summary
    unit = rows * hidden * 8  # one rows x hidden float64 tensor
    for rank in range(world):
        alive, pending = (blocks + 1) * unit, 2 * blocks * unit
        if rank == world - 1:  # the head's input, and its output's gradient (rows x 10)
            pending += unit + rows * 10 * 8
        deferred = min(rank + 1, m)
        theory = (min(world, m) - deferred) * alive + deferred * pending
        held = summary["peak_held_bytes"][rank]
        assert theory <= held <= theory + 3 * unit, (rank, held / unit, theory / unit)


def flops(tmp_path, script, world, micro_batches):
    out = tmp_path / script
    out.mkdir()
    path = variant(out, script, prepend=program("count_flops") + f"count_flops({str(out)!r})\n")
    launch(out, path, world, *SIZE, "--micro-batches", str(micro_batches))
    return [json.loads((out / f"flops{rank}.json").read_text()) for rank in range(world)]


def test_i_and_w_compute_nothing_twice(tmp_path):
    """I + W do exactly 1F1B's B's matrix products, on every stage: I stops at each Linear's
    output, and W is one product per Linear, like F. A W that backpropagated again would redo I's."""
    zero_bubble, one_f_one_b = flops(tmp_path, SCRIPT, 2, 3), flops(tmp_path, "03_1f1b.py", 2, 3)
    for rank in range(2):
        ours, theirs = zero_bubble[rank], one_f_one_b[rank]
        assert ours["forward"] == theirs["forward"] > 0
        assert ours["backward"] + ours["weight"] == theirs["full_backward"], (rank, ours, theirs)
        assert ours["weight"] == ours["forward"], (rank, ours)
