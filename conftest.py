"""Launch the real scripts as the user would (torchrun on gloo) and read back what they wrote."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

# 7 layers: not divisible by 2, 3 or 4 ranks. 10 samples: 3, 4 and 7 micro-batches do not divide it.
SIZE = ("--layers", "7", "--hidden", "24", "--batch-size", "10", "--steps", "3", "--threads", "1",
        "--lr", "0.01", "--dtype", "float64")
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}


@dataclass
class Run:
    stdout: str
    stderr: str
    summary: dict
    grads: dict  # parameter name -> gradient after the first backward, from every rank
    params: dict  # parameter name -> value after the last step
    grad_files: list  # per rank: the names it wrote
    trace: dict


def torchrun(nproc, *args, nnodes_flags=()):
    """The command line that starts `nproc` ranks on this host (a free port each time)."""
    return [sys.executable, "-m", "torch.distributed.run", *(nnodes_flags or ["--standalone"]),
            f"--nproc_per_node={nproc}", *args]


def launch(tmp_path, script, nproc, *flags, timeout=120):
    """Run `script` with `nproc` ranks (0: plain python) and collect its outputs."""
    out = tmp_path / f"{script}-{nproc}-{'_'.join(flags).replace('-', '')}"
    out.mkdir(parents=True)
    files = ["--json", "--dump-grads", str(out / "grads"), "--dump-params", str(out / "params"),
             "--trace", str(out / "trace.json")]
    command = torchrun(nproc, script) if nproc else [sys.executable, script]
    result = subprocess.run(command + list(flags) + files, cwd=HERE, env=ENV, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command + list(flags))} failed:\n{result.stderr[-3000:]}"
    summaries = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1, result.stdout
    grads, params, grad_files = {}, {}, []
    for rank in range(max(nproc, 1)):
        rank_grads = torch.load(out / "grads" / f"rank{rank}.pt")
        grad_files.append(sorted(rank_grads))
        grads.update(rank_grads)
        params.update(torch.load(out / "params" / f"rank{rank}.pt"))
    with open(out / "trace.json") as file:
        trace = json.load(file)
    return Run(result.stdout, result.stderr, summaries[0], grads, params, grad_files, trace)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Memoized launches: each configuration runs once per session, whichever tests ask for it."""
    cache, tmp_path = {}, tmp_path_factory.mktemp("runs")

    def get(script, nproc, *flags):
        key = (script, nproc, flags)
        if key not in cache:
            cache[key] = launch(tmp_path, script, nproc, *flags)
        return cache[key]

    return get


def pipelined(runs, script, world, micro_batches, size=SIZE):
    """A memoized run of a numbered script (01 takes no --micro-batches)."""
    flags = size if script == "01_naive.py" else size + ("--micro-batches", str(micro_batches))
    return runs(script, world, *flags)
