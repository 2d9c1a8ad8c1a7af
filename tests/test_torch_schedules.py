"""PyTorch's own schedules (torch_schedules.py) train the same model as the baseline: the same losses, step by step.

The losses after the first step depend on the first step's gradients through Adam, so a gradient scaled
by 1/m (PyTorch's default, scale_grads=True) moves them by about 1e-6: far more than the tolerance.
"""

import json
import sys

import pytest
import torch

from tests.launch import start_ranks, wait_ranks

# 7 layers on 4 stages (unequal ones); 16 samples in 4 equal micro-batches, since PyTorch's
# schedules size their receive buffers from the first micro-batch.
FLAGS = ("--layers", "7", "--hidden", "24", "--batch-size", "16", "--steps", "3", "--threads", "1",
         "--lr", "0.01", "--dtype", "float64")
EXACT = 1e-10


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b", "interleaved-zero-bubble", "zbv-zero-bubble"])
def test_matches_baseline(runs, tmp_path, schedule):
    command = [sys.executable, "tools/torch_schedules.py", "--schedule", schedule, *FLAGS, "--micro-batches", "4"]
    codes = wait_ranks(start_ranks(command, 2, tmp_path), timeout=60)
    stderr = "".join((tmp_path / f"stderr{rank}").read_text() for rank in range(2))
    assert codes == [0, 0], f"{schedule} exited {codes}:\n{stderr[-3000:]}"
    lines = [line for line in (tmp_path / "stdout0").read_text().splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1])
    assert (summary["schedule"], summary["world_size"]) == (schedule, 2)
    losses = torch.tensor(summary["losses"], dtype=torch.float64)
    reference = torch.tensor(runs("00_baseline.py", 0, *FLAGS).summary["losses"], dtype=torch.float64)
    assert len(losses) == 3 and torch.allclose(losses, reference, rtol=EXACT, atol=0), (losses, reference)
