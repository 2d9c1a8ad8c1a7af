"""Launch the real scripts on gloo, each rank with the environment torchrun gives it, and read back what they wrote.
The fixtures that use these live in the root's conftest.py."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

import common
import theory
from theory import stage

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
# 7 layers: not divisible by 2, 3 or 4 ranks. 10 samples: 3, 4 and 7 micro-batches do not divide it.
SIZE = ("--layers", "7", "--hidden", "24", "--batch-size", "10", "--steps", "3", "--threads", "1",
        "--lr", "0.01", "--dtype", "float64")
# a size whose bytes are easy to count: 16 layers, a micro-batch of 2 rows of 24 float64 (384 B) when m is 8
MEMORY = ("--layers", "16") + SIZE[2:4] + ("--batch-size", "16") + SIZE[6:]
SYNC = ("--sync-sends",)  # NCCL's rules on gloo: every send waits for its receiver, receives matched by order

# (script, world size, micro-batches, flags): one micro-batch, fewer than the stages, as many,
# more, and counts that do not divide the 10 samples (3, 4, 7: micro-batches of unequal size).
# A representative set runs under --sync-sends, so it proves both the gradients and that the
# order of sends and receives cannot deadlock on NCCL.
CASES = [
    ("01_naive.py", 2, 1, ()), ("01_naive.py", 3, 1, SYNC), ("01_naive.py", 4, 1, ()),
    ("02_gpipe.py", 1, 3, ()), ("02_gpipe.py", 2, 1, ()), ("02_gpipe.py", 4, 2, ()), ("02_gpipe.py", 3, 2, SYNC),
    ("02_gpipe.py", 3, 3, SYNC), ("02_gpipe.py", 4, 4, ()), ("02_gpipe.py", 4, 7, ()), ("02_gpipe.py", 4, 7, SYNC),
    ("03_1f1b.py", 1, 3, ()), ("03_1f1b.py", 2, 3, SYNC), ("03_1f1b.py", 3, 1, SYNC), ("03_1f1b.py", 4, 2, ()),
    ("03_1f1b.py", 3, 3, ()), ("03_1f1b.py", 4, 4, SYNC), ("03_1f1b.py", 4, 7, ()), ("03_1f1b.py", 4, 7, SYNC),
]


def case_ids(cases, *letters):
    """Test ids such as 03_1f1b.py-n4-m7-sync (letters "", "n", "m"): each field but the last behind its
    letter, then the flags, so that `pytest -k n4` picks every script's cases at one world size."""
    return ["-".join(f"{letter}{field}" for letter, field in zip(letters, case[:-1]))
            + "".join(f"-{flag.strip('-')}" for flag in case[-1]) for case in cases]


def size(layers):
    """SIZE with another layer count."""
    return ("--layers", str(layers)) + SIZE[2:]


EXACT = 1e-10  # float64: max|g - g_ref| <= EXACT * max|g_ref|, per tensor


def assert_close(tensors, reference, tolerance, what):
    assert sorted(tensors) == sorted(reference), f"{what}: parameter names differ"
    for name, ref in reference.items():
        error = (tensors[name] - ref).abs().max().item()
        assert error <= tolerance * ref.abs().max().item(), f"{what}: {name} is off by {error:.3g}"


def assert_matches(run, baseline):
    """The baseline's gradients after the first backward, parameters after the last step, and every
    step's loss, in the same session."""
    assert_close(run.grads, baseline.grads, EXACT, "gradients after the first backward")
    assert_close(run.params, baseline.params, EXACT, "parameters after the last step")
    losses = torch.tensor(run.summary["losses"], dtype=torch.float64)  # the JSON's float64, compared as such
    reference = torch.tensor(baseline.summary["losses"], dtype=torch.float64)
    assert len(losses) == 3 and torch.allclose(losses, reference, rtol=EXACT, atol=0), (losses, reference)


def run_quietly(command, timeout=60):
    started = time.monotonic()
    result = subprocess.run(command, cwd=HERE, env=ENV, capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - started


def assert_one_sentence(result, *words):
    """Our processes say one `error:` line and no traceback (torchrun may add its own report after it)."""
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    assert "[rank" not in result.stderr and "common.py" not in result.stderr, result.stderr


def two_nodes(script, flags_node0, flags_node1, timeout=120):
    """Two torchrun invocations of two ranks each, as on two machines, meeting on 127.0.0.1."""
    port = free_port()
    nodes = [subprocess.Popen(torchrun(2, script, *flags, nnodes_flags=[
        "--nnodes=2", f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}"]),
        cwd=HERE, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node, flags in enumerate((flags_node0, flags_node1))]
    outputs = [node.communicate(timeout=timeout) for node in nodes]
    return [(node.returncode, *output) for node, output in zip(nodes, outputs)]


# The programs the tests run or put into a script, in files of their own so that ruff checks them.
PROGRAMS = os.path.join(HERE, "tests", "programs")


def program(name):
    """The text of tests/programs/<name>.py: a snippet for variant to put into a script, or a script to write out."""
    with open(os.path.join(PROGRAMS, f"{name}.py")) as file:
        return file.read()


# PYTHONPATH: a script variant written elsewhere (a test's mutation) still imports common and harness from here.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": HERE}


@dataclass
class Run:
    stdout: str
    stderr: str
    summary: dict
    grads: dict  # parameter name -> gradient after the first backward, from every rank
    params: dict  # parameter name -> value after the last step
    rank_params: list  # per rank: its parameters after the last step (07's copies of a stage hold the same names)
    grad_files: list  # per rank: the names it wrote
    trace: dict


def torchrun(nproc, *args, nnodes_flags=()):
    """The command line that starts `nproc` ranks on this host (a free port each time)."""
    return [sys.executable, "-m", "torch.distributed.run", *(nnodes_flags or ["--standalone"]),
            f"--nproc_per_node={nproc}", *args]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Every rank imports torch and, at its first optimizer step, torch._dynamo: about 2 s of CPU each, most of a
# small run's cost. The ranks the tests start themselves are forked from one process that has imported both,
# and then run their script as `python script.py` would (runpy), with their own environment and output files.
_zygote = []


class Forked:
    """A rank forked from the zygote, with the part of Popen's interface that the tests use."""

    def __init__(self, command, env, stdout, stderr):
        if not _zygote or _zygote[0].poll() is not None:
            _zygote[:] = [subprocess.Popen([sys.executable, "-u", os.path.join(PROGRAMS, "zygote.py")], cwd=HERE,
                                           env=ENV, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)]
        self.exit = f"{stdout}.exit"
        if os.path.exists(self.exit):  # an earlier run's, in the same folder
            os.remove(self.exit)
        for path in (stdout, stderr):  # there from the start, as with Popen
            open(path, "w").close()
        request = {"argv": command[1:], "env": env, "cwd": HERE, "stdout": str(stdout), "stderr": str(stderr),
                   "exit": self.exit}
        _zygote[0].stdin.write(json.dumps(request) + "\n")
        _zygote[0].stdin.flush()
        self.pid = int(_zygote[0].stdout.readline())

    def poll(self):
        return int(open(self.exit).read()) if os.path.exists(self.exit) else None

    def kill(self):
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self):
        while self.poll() is None:
            time.sleep(0.02)
        return self.poll()


def start_ranks(command, nproc, out):
    """Start `nproc` ranks of `command` (0: one, without torchrun's variables) with the environment torchrun
    would give them, without paying for torchrun's own start-up; rank r writes to out/stdout{r}, out/stderr{r}."""
    port, ranks = free_port(), []
    for rank in range(max(nproc, 1)):
        env = {**ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
               "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)} if nproc else ENV
        ranks.append(Forked(command, env, out / f"stdout{rank}", out / f"stderr{rank}"))
    return ranks


def wait_ranks(ranks, timeout):
    """Every rank's exit code; once one fails, the others get a few seconds, then are killed."""
    deadline = time.monotonic() + timeout
    while any(rank.poll() is None for rank in ranks) and time.monotonic() < deadline:
        if any(rank.poll() for rank in ranks):
            deadline = min(deadline, time.monotonic() + 5)
        time.sleep(0.05)
    for rank in ranks:
        if rank.poll() is None:
            rank.kill()
    return [rank.wait() for rank in ranks]


def python(*argv, check=False, timeout=120):
    """`python *argv` (a tool, such as tools/plan.py) run from the repository's root as a user runs it, but forked
    from the zygote, whose torch is imported already: what subprocess.run(..., capture_output=True, text=True)
    returns (check: it must exit 0)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        (code,) = wait_ranks([Forked([sys.executable, *argv], ENV, out / "stdout", out / "stderr")], timeout)
        result = subprocess.CompletedProcess([sys.executable, *argv], code, (out / "stdout").read_text(),
                                             (out / "stderr").read_text())
    assert not check or code == 0, f"{' '.join(map(str, argv))} exited {code}:\n{result.stderr[-3000:]}"
    return result


def refusal(tmp_path, script, world, *flags):
    """Rank 0 alone of a world of `world`, forked from the zygote, for a mistake in the flags, which every rank finds
    before it meets another (tests/test_failures.py shows the others stop too): its exit code and stderr."""
    out = tmp_path / f"refusal{len(list(tmp_path.glob('refusal*')))}"
    out.mkdir()
    env = {**ENV, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    rank = Forked([sys.executable, script, *flags], env, out / "stdout", out / "stderr")
    (code,) = wait_ranks([rank], 60)
    return code, (out / "stderr").read_text()


def assert_refused(tmp_path, script, world, *flags, words):
    """refusal's rank 0 exits non-zero within seconds with one `error:` line holding every one of `words`, and no
    traceback: a mistake in the flags or a table file, found before a rank meets another."""
    started = time.monotonic()
    code, stderr = refusal(tmp_path, script, world, *flags)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert all(word in errors[0] for word in words), errors[0]
    assert time.monotonic() - started < 30
    return errors[0]


def launch(tmp_path, script, nproc, *flags, timeout=120):
    """Run `script` with `nproc` ranks (0: plain python) and collect its outputs."""
    out = tmp_path / f"{os.path.basename(script)}-{nproc}-{'_'.join(flags).replace('-', '')}"
    out.mkdir(parents=True, exist_ok=True)
    files = ["--json", "--dump-grads", str(out / "grads"), "--dump-params", str(out / "params"),
             "--trace", str(out / "trace.json")]
    command = [sys.executable, script, *flags, *files]
    codes = wait_ranks(start_ranks(command, nproc, out), timeout)
    stdout, stderr = ("".join((out / f"{name}{rank}").read_text() for rank in range(max(nproc, 1)))
                      for name in ("stdout", "stderr"))
    assert codes == [0] * len(codes), f"{' '.join(command[1:])} on {nproc} ranks exited {codes}:\n{stderr[-3000:]}"
    summaries = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1, stdout
    grads, params, grad_files, rank_params = {}, {}, [], []
    for rank in range(max(nproc, 1)):
        rank_grads = torch.load(out / "grads" / f"rank{rank}.pt")
        grad_files.append(sorted(rank_grads))
        grads.update(rank_grads)
        rank_params.append(torch.load(out / "params" / f"rank{rank}.pt"))
        params.update(rank_params[-1])
    with open(out / "trace.json") as file:
        trace = json.load(file)
    return Run(stdout, stderr, summaries[0], grads, params, rank_params, grad_files, trace)


def spoiled(summary, expected, tolerance=0.03):
    """Whether a paced run may have met noise on these shared cores: a computation longer than the pace, or a
    busiest bubble that misses `expected` by more than the tolerance."""
    return summary["paced_overruns"] > 0 or abs(summary["bubble_busiest"] - expected) > tolerance


def settled(runs, again, start, pace, expected=None, tolerance=0.03):
    """A paced run, start(runs, ("--pace", MS)) at `pace` ms, memoized; while noise may have spoiled it (spoiled,
    against `expected`, else the run's own bubble_theory), started again at twice the pace, twice more at most
    (start(again, ...), conftest's again). A stretch of noise on these shared cores delays each message by
    milliseconds, which a longer pace makes a smaller share of every span; a schedule that waits where it need
    not waits a share of the pace, so it misses at every pace."""
    run = start(runs, ("--pace", f"{pace:g}"))
    for _ in range(2):
        if not spoiled(run.summary, run.summary["bubble_theory"] if expected is None else expected, tolerance):
            break
        pace *= 2
        run = start(again, ("--pace", f"{pace:g}"))
    return run


def paced_theory(tables, placement, layers, hidden=24, classes=10, blocks=None, unit=theory.UNIT_SPANS):
    """A script's bubble_theory: the busiest rank's bubble when its table is replayed at --pace's spans of the
    stages' counted costs (theory.paced_spans; unit: UNIT_COSTS for 09, which runs a full backward as I then W),
    each stage's blocks `blocks`, or the even partition of `layers`."""
    n, chunks = len(tables), 1 + max(chunk for table in tables for _, chunk, _ in table)
    blocks = blocks or common.partition(layers, n * chunks)
    spans = theory.paced_spans(theory.counted_costs(blocks, hidden, classes), unit)
    return theory.busiest_bubble(tables, lambda rank, chunk: stage(placement, n, rank, chunk), n * chunks, spans)


def pipelined(runs, script, world, micro_batches, *extra, size=SIZE):
    """A memoized run of a numbered script (01 takes no --micro-batches); `extra`: more flags."""
    flags = size if script == "01_naive.py" else size + ("--micro-batches", str(micro_batches))
    return runs(script, world, *flags, *extra)


def variant(tmp_path, script, prepend):
    """A copy of `script` in tmp_path that runs `prepend` first (right after its docstring, which its --help
    uses): a rule or a helper replaced through its name, a mutation that a test shows is caught. It imports
    common and harness from here (PYTHONPATH)."""
    text = open(os.path.join(HERE, script)).read()
    docstring = text.index('"""', 3) + 4
    path = tmp_path / f"variant{len(list(tmp_path.glob('variant*')))}_{script}"  # a name of its own: outputs go by name
    path.write_text(text[:docstring] + prepend + text[docstring:])
    return str(path)


def deadlocks_under_sync_sends(tmp_path, script, prepend, flags):
    """Runs with gloo's own rules (launch checks it exits 0); under --sync-sends, gives up within --timeout
    with one sentence a rank (both neighbours wait, so both may give up before torchrun stops them)."""
    script = variant(tmp_path, script, prepend=prepend)
    launch(tmp_path, script, 2, *flags)
    result, seconds = run_quietly(torchrun(2, script, *flags, *SYNC, "--timeout", "3"))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and 1 <= len(errors) <= 2, result.stderr
    assert "[rank" not in result.stderr and "common.py" not in result.stderr, result.stderr
    assert seconds < 30
    return errors


KINDS = {"F": "forward", "I": "backward", "W": "weight", "B": "full_backward"}  # PyTorch's computation types, ours


def torch_schedule(schedule_class, num_ranks, num_microbatches, num_chunks, placement):
    """PyTorch's multi-stage schedule_class built from stand-in stages that carry only their place: it computes
    every rank's actions (pipeline_order) when it is built, without processes."""
    stages = [SimpleNamespace(num_stages=num_ranks * num_chunks, group_size=num_ranks, group_rank=0, submod=None,
                              stage_index=stage(placement, num_ranks, 0, chunk)) for chunk in range(num_chunks)]
    return schedule_class(stages, num_microbatches)


def torch_csv(path, schedule_class, num_ranks, num_microbatches, num_chunks, placement):
    """PyTorch's own compute_only CSV of schedule_class, written to path by its _dump_csv; its text."""
    torch_schedule(schedule_class, num_ranks, num_microbatches, num_chunks, placement)._dump_csv(
        str(path), format="compute_only")
    return path.read_text()


def torch_order(schedule_class, num_ranks, num_microbatches, num_chunks, placement):
    """Every rank's compute actions, as PyTorch's multi-stage schedule_class orders them, in our tuples. An
    overlapped F&B (OVERLAP_F_B) is its sub-actions, run one after the other unless a function is registered."""
    schedule = torch_schedule(schedule_class, num_ranks, num_microbatches, num_chunks, placement)
    orders = []
    for rank in range(num_ranks):
        actions = [(sub, action.sub_actions is not None) for action in schedule.pipeline_order[rank]
                   if action is not None for sub in (action.sub_actions or [action])]
        # both placements: stage // n is the chunk (the V's second arm holds stages n to 2n - 1); an OVERLAP_F_B's
        # full backward is our "overlapped_backward"
        orders.append([("overlapped_backward" if overlapped and action.computation_type.value == "B"
                        else KINDS[action.computation_type.value], action.stage_index // num_ranks,
                        action.microbatch_index)
                       for action, overlapped in actions if action.computation_type.value in KINDS])
    return orders
