"""PyTorch's own schedules (torch_schedules.py) train the same model as the baseline: the same losses, step by step;
and PyTorch's own runtime (_PipelineScheduleRuntime) runs the table tools/plan.py saves: the baseline's gradients.

The losses after the first step depend on the first step's gradients through Adam, so a gradient scaled
by 1/m (PyTorch's default, scale_grads=True) moves them by about 1e-6: far more than the tolerance.
"""

import json
import sys

import pytest
import torch

from tests.launch import assert_close, python, start_ranks, wait_ranks

# 7 layers on 4 stages (unequal ones); 16 samples in 4 equal micro-batches, since PyTorch's
# schedules size their receive buffers from the first micro-batch.
FLAGS = ("--layers", "7", "--hidden", "24", "--batch-size", "16", "--steps", "3", "--threads", "1",
         "--lr", "0.01", "--dtype", "float64")
EXACT = 1e-10


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b", "interleaved-zero-bubble", "zbv"])
def test_matches_baseline(runs, tmp_path, schedule):
    command = [sys.executable, "tools/torch_schedules.py", "--schedule", schedule, *FLAGS, "--micro-batches", "4"]
    codes = wait_ranks(start_ranks(command, 2, tmp_path), timeout=60)
    stderr = "".join((tmp_path / f"stderr{rank}").read_text() for rank in range(2))
    assert codes == [0, 0], f"{schedule} exited {codes}:\n{stderr[-3000:]}"
    lines = [line for line in (tmp_path / "stdout0").read_text().splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1])
    assert (summary["schedule"], summary["world_size"]) == (schedule, 2)
    assert len(summary["step_cpu_ms"]) == 2 and all(cpu_ms > 0 for cpu_ms in summary["step_cpu_ms"]), summary
    losses = torch.tensor(summary["losses"], dtype=torch.float64)
    reference = torch.tensor(runs("00_baseline.py", 0, *FLAGS).summary["losses"], dtype=torch.float64)
    assert len(losses) == 3 and torch.allclose(losses, reference, rtol=EXACT, atol=0), (losses, reference)


@pytest.mark.parametrize("world, plan_flags", [(2, ("--costs", "1,2,1")), (2, ("--virtual-stages", "3")),
                                               (3, ("--costs", "1,2,1,0.3", "--memory", "6")), (4, ())])
def test_a_saved_plan_runs_in_pytorchs_runtime(runs, tmp_path, world, plan_flags):
    """plan.py --save, then torch_schedules.py --schedule FILE.csv: PyTorch's _PipelineScheduleRuntime loads the
    search's table and gives the baseline's gradients and losses in float64. 9 layers: room for the V's 8 stages."""
    flags = (*FLAGS, "--layers", "9")
    path = tmp_path / "plan.csv"
    python("tools/plan.py", "--stages", str(world), "--micro-batches", "4", *plan_flags, "--save", str(path),
           check=True)
    command = [sys.executable, "tools/torch_schedules.py", "--schedule", str(path), *flags, "--micro-batches", "4",
               "--dump-grads", str(tmp_path / "grads")]
    codes = wait_ranks(start_ranks(command, world, tmp_path), timeout=60)
    stderr = "".join((tmp_path / f"stderr{rank}").read_text() for rank in range(world))
    assert codes == [0] * world, f"exited {codes}:\n{stderr[-3000:]}"
    grads = {}
    for rank in range(world):
        grads.update(torch.load(tmp_path / "grads" / f"rank{rank}.pt"))
    baseline = runs("00_baseline.py", 0, *flags)
    assert_close(grads, baseline.grads, EXACT, "gradients after the first backward")
    summary = json.loads([line for line in (tmp_path / "stdout0").read_text().splitlines() if line[:1] == "{"][-1])
    losses = torch.tensor(summary["losses"], dtype=torch.float64)
    reference = torch.tensor(baseline.summary["losses"], dtype=torch.float64)
    assert torch.allclose(losses, reference, rtol=EXACT, atol=0), (losses, reference)
