"""--recompute: each stage keeps only its input for a micro-batch in flight and runs its forward again
inside the backward. Every script gives the baseline's gradients, losses and parameters, bitwise those of
the same run without the flag; the held bytes are tools.held.held_theory's on every rank (derived in
docs/design.md, *Recomputation*), 1F1B's largest at most half its largest without the flag; and 05 keeping
its first forward's Linear inputs for W fails that theory."""

import pytest
import torch

import schedules
from tests.launch import MEMORY, assert_matches, case_ids, launch, pipelined, program, size, variant
from tools.held import held_count, held_theory

RECOMPUTE = ("--recompute",)
SYNC = ("--sync-sends",)

# (script, world, layers, flags after the size): cases the other modules run without the flag, so that only
# the runs with it are new. Every script; worlds 0 (plain python) to 4; m below, at and above n; 7 and 9
# layers, which 2, 3 and 4 ranks (and 04's and 06's chunks) do not divide; 10 samples in 3, 5 or 7
# micro-batches of unequal size; some under --sync-sends.
CASES = [
    ("00_baseline.py", 0, 7, ()),
    ("01_naive.py", 3, 7, SYNC),
    ("02_gpipe.py", 4, 7, ("--micro-batches", "7")), ("02_gpipe.py", 3, 7, ("--micro-batches", "2", *SYNC)),
    ("03_1f1b.py", 0, 7, ("--micro-batches", "3")), ("03_1f1b.py", 4, 7, ("--micro-batches", "7", *SYNC)),
    ("04_interleaved_1f1b.py", 2, 7, ("--micro-batches", "5", "--virtual-stages", "2")),
    ("04_interleaved_1f1b.py", 3, 9, ("--micro-batches", "5", "--virtual-stages", "3")),
    ("05_zero_bubble.py", 4, 7, ("--micro-batches", "7", *SYNC)),
    ("05_zero_bubble.py", 3, 7, ("--micro-batches", "1", *SYNC)),
    ("06_zbv.py", 0, 7, ("--micro-batches", "3")), ("06_zbv.py", 3, 7, ("--micro-batches", "7", *SYNC)),
    ("07_pp_dp.py", 4, 7, ("--data-parallel", "2", "--micro-batches", "2", *SYNC)),
]


def run(runs, script, world, layers, flags):
    return runs(script, world, *size(layers), *flags)


@pytest.mark.parametrize("script,world,layers,flags", CASES, ids=case_ids(CASES, "", "n", "L"))
def test_matches_baseline_bitwise_without_it(runs, script, world, layers, flags):
    """The baseline's gradients, losses and parameters; bitwise those of the run without the flag (the same
    arithmetic, done again); the same micro-batches in flight; and the table says the flag is on."""
    plain, recomputed = run(runs, script, world, layers, flags), run(runs, script, world, layers, flags + RECOMPUTE)
    assert_matches(recomputed, runs("00_baseline.py", 0, *size(layers)))
    for name, grad in plain.grads.items():
        assert torch.equal(recomputed.grads[name], grad), name
    for name, param in plain.params.items():
        assert torch.equal(recomputed.params[name], param), name
    assert recomputed.summary["losses"] == plain.summary["losses"]
    assert recomputed.summary["recompute"] and not plain.summary["recompute"]
    assert recomputed.summary["peak_inflight_microbatches"] == plain.summary["peak_inflight_microbatches"]
    assert "--recompute:" in recomputed.stdout and "--recompute:" not in plain.stdout


# The held-bytes size: 4 ranks, 8 micro-batches of 2 rows, 16 layers of width 24 (4 blocks a stage, 2 a chunk).
WORLD, M, ROWS, HIDDEN, LAYERS = 4, 8, 2, 24, 16
UNIT = ROWS * HIDDEN * 8  # one micro-batch's rows x hidden float64 tensor
HELD = [("02_gpipe.py", ()), ("02_gpipe.py", RECOMPUTE), ("03_1f1b.py", ()), ("03_1f1b.py", RECOMPUTE),
        ("05_zero_bubble.py", ()), ("05_zero_bubble.py", RECOMPUTE), ("06_zbv.py", RECOMPUTE)]


@pytest.mark.parametrize("script,flags", HELD, ids=case_ids(HELD, ""))
def test_held_bytes_are_the_theory(runs, script, flags):
    """Every rank's peak held bytes are tools.held.held_theory's count exactly (06's: held_count over its table;
    without the flag, test_zbv.py);
    with the flag, autograd keeps one micro-batch's activations at a time, during its B (05's and 06's: its I)."""
    summary = pipelined(runs, script, WORLD, M, *flags, size=MEMORY).summary
    blocks = LAYERS // WORLD // (2 if script == "06_zbv.py" else 1)
    if script == "06_zbv.py":  # counted over its table
        theory = held_count(schedules.zbv(WORLD, M), "v", [blocks] * 2 * WORLD, ROWS, HIDDEN, recompute=bool(flags))
    else:
        theory = held_theory(script, WORLD, M, blocks, ROWS, HIDDEN, recompute=bool(flags))
    assert [held / UNIT for held in summary["peak_held_bytes"]] == pytest.approx(theory, abs=1e-9)
    if flags:  # the stage with the head also saves its loss's tensors: rows x 10 log-probabilities, labels, a weight
        head_rank, extra = 0 if script == "06_zbv.py" else WORLD - 1, (11 * ROWS + 1) / (ROWS * HIDDEN)
        one = [blocks + 1 + extra * (rank == head_rank) for rank in range(WORLD)]
        assert [saved / UNIT for saved in summary["peak_activation_bytes"]] == pytest.approx(one, abs=1e-9)


def test_recompute_halves_1f1bs_largest_rank(runs):
    """1F1B's largest rank: 4 micro-batches of 5 units and 2 in transit without the flag; with it, rank 1's 3
    inputs, the 4 blocks recomputed and 3 in transit: at most half."""
    plain, recomputed = (pipelined(runs, "03_1f1b.py", WORLD, M, *flags, size=MEMORY).summary
                         for flags in ((), RECOMPUTE))
    assert max(recomputed["peak_held_bytes"]) <= 0.5 * max(plain["peak_held_bytes"])


def test_keeping_the_first_forwards_linear_inputs_fails_the_theory(tmp_path):
    """The held-bytes theory of 05 with the flag is what catches W's inputs noted in F instead of in I's
    recomputation: every rank then holds more, most those with micro-batches waiting for their I."""
    script = variant(tmp_path, "05_zero_bubble.py", prepend=program("keep_first_forward"))
    broken = launch(tmp_path, script, WORLD, *MEMORY, "--micro-batches", str(M), *RECOMPUTE).summary
    theory = held_theory("05_zero_bubble.py", WORLD, M, LAYERS // WORLD, ROWS, HIDDEN, recompute=True)
    excess = [held / UNIT - units for held, units in zip(broken["peak_held_bytes"], theory)]
    assert all(units > 1 for units in excess), excess
