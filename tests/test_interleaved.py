"""Interleaved 1F1B (04): the baseline's gradients on every shape of pipeline, the in-flight theory,
the held bytes, and bad input in one sentence."""


import pytest

from tests.launch import (
    MEMORY,
    SYNC,
    assert_matches,
    assert_refused,
    case_ids,
    pipelined,
    size,
)
from theory import interleaved_inflight

SCRIPT = "04_interleaved_1f1b.py"


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


def interleaved(runs, world, micro_batches, virtual_stages, layers=7, *flags):
    return pipelined(runs, SCRIPT, world, micro_batches, "--virtual-stages", str(virtual_stages), *flags,
                     size=size(layers))


@pytest.mark.parametrize("world,micro_batches,virtual_stages,layers,flags", CASES,
                         ids=case_ids(CASES, "n", "m", "v", "L"))
def test_matches_baseline(runs, world, micro_batches, virtual_stages, layers, flags):
    baseline = runs("00_baseline.py", 0, *size(layers))
    run = interleaved(runs, world, micro_batches, virtual_stages, layers, *flags)
    assert run.summary["virtual_stages"] == virtual_stages
    assert_matches(run, baseline)
    # together the ranks' files hold every parameter exactly once
    names = [name for rank_names in run.grad_files for name in rank_names]
    assert sorted(names) == sorted(baseline.grads) and len(run.grad_files) == max(world, 1)


@pytest.mark.parametrize("world,micro_batches,virtual_stages,layers,flags", CASES,
                         ids=case_ids(CASES, "n", "m", "v", "L"))
def test_inflight_is_the_theory(runs, world, micro_batches, virtual_stages, layers, flags):
    summary = interleaved(runs, world, micro_batches, virtual_stages, layers, *flags).summary
    theory = [interleaved_inflight(max(world, 1), micro_batches, virtual_stages, rank) for rank in range(max(world, 1))]
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


@pytest.mark.parametrize("ranks,flags,words", [
    (1, ("--virtual-stages", "0"), ("--virtual-stages", "at least 1")),
    (2, ("--virtual-stages", "1"), ("--virtual-stages 1", "03_1f1b.py")),
    (2, ("--layers", "3"), ("2 ranks x 2 virtual stages", "3 layers")),
])
def test_bad_input(tmp_path, ranks, flags, words):
    assert_refused(tmp_path, SCRIPT, ranks, *flags, words=words)
