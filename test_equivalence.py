"""Every pipelined run gives the baseline's gradients, losses and parameters.

The baseline (00) runs in the same session; nothing is compared against stored numbers.
"""

import pytest
import torch

from tests.launch import CASES, EXACT, SIZE, assert_close, assert_matches, case_ids, pipelined


@pytest.mark.parametrize("script,world,micro_batches,flags", CASES, ids=case_ids(CASES, "", "n", "m"))
def test_matches_baseline(runs, baseline, script, world, micro_batches, flags):
    run = pipelined(runs, script, world, micro_batches, *flags)
    assert_matches(run, baseline)
    # together the ranks' files hold every parameter exactly once
    names = [name for rank_names in run.grad_files for name in rank_names]
    assert sorted(names) == sorted(baseline.grads) and len(run.grad_files) == world


def test_naive_is_bitwise_the_baseline(runs, baseline):
    run = pipelined(runs, "01_naive.py", 4, 1)
    for name, ref in baseline.grads.items():
        assert torch.equal(run.grads[name], ref), name
    assert run.summary["losses"] == baseline.summary["losses"]


def test_gpipe_with_one_micro_batch_is_bitwise_naive(runs):
    naive, gpipe = pipelined(runs, "01_naive.py", 2, 1), pipelined(runs, "02_gpipe.py", 2, 1)
    for name, ref in naive.grads.items():
        assert torch.equal(gpipe.grads[name], ref), name
    assert gpipe.summary["losses"] == naive.summary["losses"]


def test_without_torchrun_is_a_world_of_one(runs, baseline):
    run = runs("03_1f1b.py", 0, *SIZE, "--micro-batches", "3")
    assert run.summary["world_size"] == 1
    assert_close(run.grads, baseline.grads, EXACT, "gradients")


def test_float32(runs):
    size = tuple(flag if flag != "float64" else "float32" for flag in SIZE)
    baseline = runs("00_baseline.py", 0, *size)
    run = pipelined(runs, "03_1f1b.py", 4, 3, size=size)
    assert_close(run.grads, baseline.grads, 1e-5, "float32 gradients")


def test_the_check_catches_an_unscaled_loss(runs, baseline):
    """Without the loss scaling, m micro-batches give m times the gradient: the tolerance must see it."""
    run = pipelined(runs, "02_gpipe.py", 4, 2)
    with pytest.raises(AssertionError):
        assert_close({name: 2 * grad for name, grad in run.grads.items()}, baseline.grads, EXACT, "unscaled")
    with pytest.raises(AssertionError):  # even a last-bits-only mistake in one tensor
        off = dict(run.grads, **{"head.bias": run.grads["head.bias"] * (1 + 1e-8)})
        assert_close(off, baseline.grads, EXACT, "perturbed")


def test_default_run_learns(runs):
    """The default task, sizes and --lr, the README's first command: the loss really falls (not stuck at
    ln(10) = 2.30), and at every step (at --lr 5e-4 Adam's first steps overshoot: 3.31, then 5.6, before it falls)."""
    run = runs("03_1f1b.py", 2)
    losses = run.summary["losses"]
    assert run.summary["layers"] == 16 and run.summary["num_microbatches"] == 8
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses
    assert len(losses) == 20 and all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
