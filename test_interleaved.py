"""Interleaved 1F1B (04): the baseline's gradients on every shape of pipeline, the in-flight theory,
03's schedule with one chunk, tags that keep two chunks' tensors apart, and bad input in one sentence."""

import sys

import pytest
import torch

from conftest import MEMORY, SIZE, SYNC, pipelined, torchrun, variant
from test_equivalence import EXACT, assert_close, assert_matches
from test_failures import assert_one_sentence, run_quietly

SCRIPT = "04_interleaved_1f1b.py"


def size(layers):
    """SIZE with another layer count: n * v stages need at least n * v layers."""
    return ("--layers", str(layers)) + SIZE[2:]


# (world size, micro-batches, virtual stages, layers, flags); 0 ranks: plain python, a world of one whose
# chunks hand tensors over in memory. The layer counts are not multiples of n * v (leftover layers), and
# 10 samples in 3, 4 or 7 micro-batches give micro-batches of unequal size. m below, equal to and above n,
# and m that n does not divide (the table's holes). A representative set runs under --sync-sends.
CASES = [
    (0, 3, 2, 7, ()), (0, 4, 3, 7, ()),
    (2, 1, 2, 7, ()), (2, 2, 2, 7, SYNC), (2, 3, 3, 7, SYNC), (2, 5, 2, 7, ()),
    (3, 2, 2, 7, SYNC), (3, 4, 2, 7, ()), (3, 5, 3, 9, ()),
    (4, 3, 2, 9, SYNC), (4, 4, 2, 9, ()), (4, 7, 2, 9, ()), (4, 7, 2, 9, SYNC), (4, 8, 2, 9, SYNC),
    (2, 8, 3, 7, SYNC),
]


def case_id(world, micro_batches, virtual_stages, layers, flags):
    return f"n{world}-m{micro_batches}-v{virtual_stages}-L{layers}" + "".join(f"-{flag.strip('-')}" for flag in flags)


def interleaved(runs, world, micro_batches, virtual_stages, layers=7, *flags):
    return pipelined(runs, SCRIPT, world, micro_batches, "--virtual-stages", str(virtual_stages), *flags,
                     size=size(layers))


def inflight_theory(n, v, m, rank):
    """(micro-batch, chunk) pairs alive on `rank` at its first backward, which is its peak: the forwards
    of its warm-up and the one before that backward, less the holes among them."""
    if v == 1:
        return min(n - rank, m)  # 1F1B
    if m % n == 0:
        return min((v - 1) * n + 2 * (n - rank) - 1, m * v)
    padded = (m + n - 1) // n * n
    forwards = min(2 * (n - rank - 1) + (v - 1) * n, padded * v) + 1
    # position p of the table runs micro-batch (p // nv) n + p % n, a hole from m on
    return sum((p // (n * v)) * n + p % n < m for p in range(min(forwards, padded * v)))


@pytest.mark.parametrize("world,micro_batches,virtual_stages,layers,flags", CASES,
                         ids=[case_id(*case) for case in CASES])
def test_matches_baseline(runs, world, micro_batches, virtual_stages, layers, flags):
    baseline = runs("00_baseline.py", 0, *size(layers))
    run = interleaved(runs, world, micro_batches, virtual_stages, layers, *flags)
    assert run.summary["virtual_stages"] == virtual_stages
    assert_matches(run, baseline)
    # together the ranks' files hold every parameter exactly once
    names = [name for rank_names in run.grad_files for name in rank_names]
    assert sorted(names) == sorted(baseline.grads) and len(run.grad_files) == max(world, 1)


@pytest.mark.parametrize("world,micro_batches,virtual_stages,layers,flags", CASES,
                         ids=[case_id(*case) for case in CASES])
def test_inflight_is_the_theory(runs, world, micro_batches, virtual_stages, layers, flags):
    summary = interleaved(runs, world, micro_batches, virtual_stages, layers, *flags).summary
    theory = [inflight_theory(max(world, 1), virtual_stages, micro_batches, rank) for rank in range(max(world, 1))]
    assert summary["peak_inflight_microbatches"] == theory
    assert summary["expected_inflight_microbatches"] == theory


def test_rank_0_holds_v_plus_1_groups_less_one(runs):
    """The memory price: rank 0 keeps (v + 1) n - 1 chunks' activations alive (once m v is that many),
    against 1F1B's n stages'."""
    assert interleaved(runs, 4, 7, 2, 9).summary["peak_inflight_microbatches"][0] == (2 + 1) * 4 - 1


def test_held_bytes_are_the_activations_and_3_tensors_in_transit(runs):
    """Sends are released as soon as their receiver surely has them, also round the ring: at 4 ranks, 8
    micro-batches and 16 layers, every rank holds its chunks' activations plus at most 3 tensors (a gradient
    received and one sent, and the next forward's input), as 1F1B does. Kept to the step's end, the
    gradients sent pile up (rank 0 then holds 6 tensors above its activations)."""
    summary = pipelined(runs, SCRIPT, 4, 8, "--virtual-stages", "2", size=MEMORY).summary
    unit = 2 * 24 * 8  # one micro-batch's rows x hidden, float64
    for rank, (kept, held) in enumerate(zip(summary["peak_activation_bytes"], summary["peak_held_bytes"])):
        assert kept < held <= kept + 3 * unit, (rank, (held - kept) / unit)


def spans(run):
    """Every rank's forwards, backwards and waits (on a receive, or for a send to be received) in the
    order it ran them: (step, kind, micro-batch, chunk)."""
    events = sorted((e for e in run.trace["traceEvents"] if e.get("cat") in ("forward", "backward", "wait")),
                    key=lambda e: e["ts"])
    return [[(e["args"]["step"], e["cat"], e["args"]["micro_batch"], e["args"]["chunk"])
             for e in events if e["pid"] == rank] for rank in range(run.summary["world_size"])]


@pytest.mark.parametrize("world,micro_batches,flags", [(4, 7, ()), (2, 3, SYNC)])
def test_one_chunk_is_1f1b(runs, world, micro_batches, flags):
    """--virtual-stages 1 is 03's schedule: on every rank the same forwards and backwards in the same
    order, waiting on the same tensors between them, and bit for bit the same gradients, parameters,
    losses and activation bytes."""
    one_f_one_b = pipelined(runs, "03_1f1b.py", world, micro_batches, *flags)
    run = interleaved(runs, world, micro_batches, 1, 7, *flags)
    assert spans(run) == spans(one_f_one_b)
    for name, ref in one_f_one_b.grads.items():
        assert torch.equal(run.grads[name], ref), name
    for name, ref in one_f_one_b.params.items():
        assert torch.equal(run.params[name], ref), name
    for key in ("losses", "peak_inflight_microbatches", "peak_activation_bytes"):
        assert run.summary[key] == one_f_one_b.summary[key], key


# Megatron-LM's steady state without overlap: one group of both sends and both receives per iteration.
ONE_GROUP = [
    ("if num_chunks == 1 or i == 0:", "if True:"),
    ('''            done = {}
            input_tensor = exchange("send_forward_recv_forward",''',
     '''            grad_input = backward(i, grad_output)
            input_tensor, grad_output = exchange("one_group", send_backward=(i, grad_input), recv_backward=i + 1,
                                                 send_forward=(j, output_tensor), recv_forward=j + 1)
            continue
            input_tensor = exchange("send_forward_recv_forward",'''),
]
# Its receives posted gradient first, while the peer sends the activation first; and, in the second
# variant, every tag 0 on the wire, so that gloo matches the receives from one peer by posting order.
REVERSED = '''"""Interleaved 1F1B, receives posted in the other order."""
import torch.distributed as dist
import common
_p2p = common._p2p
common._p2p = lambda name, sends, recvs, meanwhile=None: _p2p(name, sends, recvs[::-1], meanwhile)
'''
ZERO_TAGS = "common._operation = lambda op, tensor, link: dist.P2POp(op, tensor, link[0], tag=0)\n"


def test_a_receive_never_gets_the_other_chunks_tensor(runs, tmp_path):
    """With two ranks the previous and the next rank are the same peer, which sends both activations and
    gradients, all of one shape when the micro-batches are (10 samples in 5). A receive gets the right
    tensor through its tag, whatever the order of posting: in one group of both receives posted gradient
    first, the gradients still match the baseline; with every tag 0 as well, the run ends normally but
    with swapped tensors and wrong gradients."""
    baseline = runs("00_baseline.py", 0, *SIZE)
    flags = ("--micro-batches", "5", "--virtual-stages", "2", "--timeout", "5")
    reversed_order = runs(variant(tmp_path, SCRIPT, ONE_GROUP, prepend=REVERSED), 2, *SIZE, *flags)
    assert_close(reversed_order.grads, baseline.grads, EXACT, "receives reversed")
    zeroed = runs(variant(tmp_path, SCRIPT, ONE_GROUP, prepend=REVERSED + ZERO_TAGS), 2, *SIZE, *flags)  # exits 0
    with pytest.raises(AssertionError, match="is off by"):
        assert_close(zeroed.grads, baseline.grads, EXACT, "receives reversed, tags zeroed")


@pytest.mark.parametrize("ranks,flags,words", [
    (0, ("--virtual-stages", "0"), ("--virtual-stages", "at least 1")),
    (2, ("--layers", "3"), ("2 ranks x 2 virtual stages", "3 layers")),
])
def test_bad_input(ranks, flags, words):
    command = [sys.executable, SCRIPT, *flags] if ranks == 0 else torchrun(ranks, SCRIPT, *flags)
    result, seconds = run_quietly(command)
    assert_one_sentence(result, *words)
    assert seconds < 30
