"""07: pipelines side by side. Every layout gives the baseline's gradients, losses and parameters;
every copy of a stage holds the same bits after every step; the all-reduce starts after the rank's
last backward and, under pacing, only the first stage's adds to the step. A two-node launch trains
like one; a stopped rank and each bad layout end with one sentence."""

import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch

import harness
import harness.collectives
import schedules
from tests.launch import (
    ENV,
    EXACT,
    HERE,
    SIZE,
    SYNC,
    assert_close,
    assert_one_sentence,
    case_ids,
    paced_theory,
    program,
    start_ranks,
    two_nodes,
    variant,
    wait_ranks,
)

SCRIPT = "07_pp_dp.py"
# (stages, copies, micro-batches, flags). The 10 samples of SIZE split into 5 + 5 or 4 + 3 + 3;
# micro-batches fewer than the stages, as many and more; pipelines of 1 to 3 stages (a pipeline of
# one stage is plain data parallelism, one copy is 03); a representative set under --sync-sends.
CASES = [
    (1, 2, 3, ()), (2, 2, 2, SYNC), (2, 1, 3, ()), (3, 2, 4, ()), (2, 3, 1, SYNC), (3, 1, 2, SYNC), (2, 3, 3, ()),
]
PACE_MS = 30
PACED = ("--steps", "8", "--micro-batches", "4")  # 2 + 1 + 1 + 1 samples a pipeline, paced


def pp_dp(runs, stages, copies, micro_batches, *flags):
    return runs(SCRIPT, stages * copies, *SIZE, "--data-parallel", str(copies), "--micro-batches", str(micro_batches),
                *flags)


def spans(run, kind):
    """{(rank, step): [(start, end), ...]} of one kind of span in the trace, in microseconds."""
    found = {}
    for event in run.trace["traceEvents"]:
        if event["ph"] == "X" and event["cat"] == kind:
            key, span = (event["pid"], event["args"]["step"]), (event["ts"], event["ts"] + event["dur"])
            found.setdefault(key, []).append(span)
    return found


@pytest.fixture(scope="module")
def baseline(runs):
    return runs("00_baseline.py", 0, *SIZE)


@pytest.mark.parametrize("stages,copies,micro_batches,flags", CASES, ids=case_ids(CASES, "pp", "dp", "m"))
def test_matches_baseline(runs, baseline, stages, copies, micro_batches, flags):
    run = pp_dp(runs, stages, copies, micro_batches, *flags)
    assert_close(run.grads, baseline.grads, EXACT, "gradients after the first backward")
    for rank, params in enumerate(run.rank_params):
        assert_close(params, {name: baseline.params[name] for name in params}, EXACT, f"rank {rank}'s parameters")
    losses = torch.tensor(run.summary["losses"], dtype=torch.float64)  # the JSON's float64, compared as such
    reference = torch.tensor(baseline.summary["losses"], dtype=torch.float64)
    assert len(losses) == 3 and torch.allclose(losses, reference, rtol=EXACT, atol=0), (losses, reference)
    # every parameter is on exactly one stage, and every stage is on `copies` ranks
    names = [name for rank_names in run.grad_files for name in rank_names]
    assert sorted(names) == sorted(list(baseline.grads) * copies)
    assert run.summary["world_size"] == stages * copies and run.summary["data_parallel"] == copies


@pytest.mark.parametrize("stages,copies,micro_batches,flags", CASES, ids=case_ids(CASES, "pp", "dp", "m"))
def test_copies_hold_the_same_bits(runs, stages, copies, micro_batches, flags):
    """Rank copy * stages + stage: the copies of a stage are a pipeline's length apart."""
    run = pp_dp(runs, stages, copies, micro_batches, *flags)
    for rank, params in enumerate(run.rank_params):
        first_copy = run.rank_params[rank % stages]
        assert sorted(params) == sorted(first_copy)
        for name, value in params.items():
            assert torch.equal(value, first_copy[name]), (rank, name)
    assert [run.summary["stage_layers"][rank] for rank in range(stages)] * copies == run.summary["stage_layers"]


def test_copies_hold_the_same_bits_after_every_step(runs, baseline, tmp_path_factory):
    """Three copies of a one-stage pipeline, so that an all-reduce adds three numbers, whose order
    matters; each rank writes its parameters after every step."""
    folder = tmp_path_factory.mktemp("every_step")
    script = variant(folder, SCRIPT, prepend=program("save_every_step") + f"save_every_step({str(folder)!r})\n")
    run = runs(script, 3, *SIZE, "--data-parallel", "3", "--micro-batches", "3")
    assert_close(run.params, baseline.params, EXACT, "parameters after the last step")
    for step in range(3):
        params = [torch.load(folder / f"step{step}-rank{rank}.pt") for rank in range(3)]
        assert len(params[0]) == 16  # 7 blocks and the head, a weight and a bias each
        for index, value in enumerate(params[0]):
            assert torch.equal(params[1][index], value) and torch.equal(params[2][index], value), (step, index)


@pytest.mark.parametrize("stages,copies,micro_batches,flags", CASES, ids=case_ids(CASES, "pp", "dp", "m"))
def test_allreduce_after_the_last_backward(runs, stages, copies, micro_batches, flags):
    """Each rank's all-reduce is one span a step, from after its last backward; the table says how
    long it took and how much of it was hidden; 1F1B's in-flight counts are unchanged."""
    run = pp_dp(runs, stages, copies, micro_batches, *flags)
    backwards, reduces = spans(run, "full_backward"), spans(run, "allreduce")
    for rank in range(stages * copies):
        for step in range(3):
            assert len(backwards[rank, step]) == micro_batches and len(reduces[rank, step]) == 1
            assert reduces[rank, step][0][0] >= max(end for _, end in backwards[rank, step])
    summary = run.summary
    assert all(0 <= hidden <= total for hidden, total in zip(summary["allreduce_hidden_ms"], summary["allreduce_ms"]))
    header = next(line for line in run.stdout.splitlines() if line.split()[:2] == ["rank", "layers"])
    assert header.split()[-2:] == ["all-reduce", "hidden"]
    assert summary["peak_inflight_microbatches"] == [min(stages - rank % stages, micro_batches)
                                                     for rank in range(stages * copies)]
    assert summary["bubble_theory"] == pytest.approx(paced_theory(schedules.one_f_one_b(stages, micro_batches), "loop",
                                                                  7))


def check_first_stage_adds(run, one, stages, pace_ms):
    """The two claims below on one run of 07 (run) and one of 03 (one, its summary), paced at pace_ms."""
    backwards, reduces = spans(run, "full_backward"), spans(run, "allreduce")
    for step in range(1, 8):
        for rank in range(2 * stages):
            pipeline = range(rank - rank % stages, rank - rank % stages + stages)
            last_backward = max(end for peer in pipeline for _, end in backwards[peer, step])
            start, end = reduces[rank, step][0]
            assert start - max(end for _, end in backwards[rank, step]) < pace_ms / 4 * 1e3, (rank, step)  # in µs
            assert (end < last_backward) == (rank % stages > 0), (rank, step)
    summary = run.summary
    for rank in range(2 * stages):
        if rank % stages:
            assert summary["allreduce_hidden_ms"][rank] == pytest.approx(summary["allreduce_ms"][rank])
    first_stage = max(summary["allreduce_ms"][rank] for rank in (0, stages))
    extra = summary["step_ms_median"] - one["step_ms_median"]
    assert extra <= first_stage + 0.05 * one["step_ms_median"], (extra, first_stage, one["step_ms_median"])


@pytest.mark.parametrize("stages", [3, 2])
def test_only_the_first_stage_allreduce_adds_to_the_step(runs, again, stages):
    """Paced, two copies. In every step each rank starts its all-reduce right after its own last
    backward, and every stage's but the first ends before its pipeline's last backward does. The
    step is 03's on one copy's share of the batch (5 samples) plus at most the first stage's
    all-reduce (its longer copy's: the copy that finishes first waits for the other), within 5% of
    the step: the spread of the same run's step medians from one run to the next on this shared
    2-core machine (and, at 2 x 2, 03's two ranks have a core each where 07's four share two). A pair
    of runs that noise may have spoiled (a rank late by a quarter of the pace) is started again at twice the pace,
    three times in all (conftest's again; tests.launch.settled says why): a schedule that waits where it need not
    fails at every pace."""
    for attempt in range(3):  # a noisy stretch of these shared cores can last a few launches
        pace_ms, launch = PACE_MS * 2 ** attempt, again if attempt else runs
        paced = (*PACED, "--pace", str(pace_ms))
        try:
            return check_first_stage_adds(launch(SCRIPT, 2 * stages, *SIZE, "--data-parallel", "2", *paced),
                                          launch("03_1f1b.py", stages, *SIZE, "--batch-size", "5", *paced).summary,
                                          stages, pace_ms)
        except AssertionError:
            if attempt == 2:
                raise


def test_two_nodes_train_like_one(runs):
    """Pipelines on consecutive ranks: ranks 0-1 (node 0) are pipeline 0, ranks 2-3 (node 1) pipeline
    1, and each stage's copies (ranks 0 and 2, 1 and 3) sum their gradients across the nodes."""
    flags = SIZE + ("--data-parallel", "2", "--micro-batches", "2", *SYNC, "--json")
    (code0, out0, err0), (code1, _, err1) = two_nodes(SCRIPT, flags, flags)
    assert code0 == code1 == 0, err0 + err1
    two = json.loads([line for line in out0.splitlines() if line.startswith("{")][0])
    one = pp_dp(runs, 2, 2, 2, *SYNC).summary
    assert two["world_size"] == 4 and two["data_parallel"] == 2 and two["losses"] == one["losses"]


@pytest.mark.parametrize("world,flags,words", [
    (6, ("--data-parallel", "4"), ("--data-parallel 4", "6 ranks", "1, 2, 3, 6")),
    (6, ("--data-parallel", "2", "--layers", "2"), ("2 pipelines of 3", "2 layers", "--layers 3")),
    (6, ("--data-parallel", "3", "--batch-size", "10", "--micro-batches", "4"),
     ("--micro-batches", "3 of 10 samples in 3 pipelines")),
    (3, ("--data-parallel", "3", "--batch-size", "2"), ("--batch-size 2", "3 pipelines")),
    (1, ("--data-parallel", "0"), ("--data-parallel", "at least 1")),
])
def test_bad_layout(world, flags, words):
    """Each rank checks the flags before it meets any other: one process stands for them."""
    result = subprocess.run([sys.executable, SCRIPT, *flags], cwd=HERE, env={**ENV, "WORLD_SIZE": str(world)},
                            capture_output=True, text=True, timeout=30)
    assert_one_sentence(result, *words)


def test_stuck_rank_times_out(tmp_path):
    """The groups the mesh builds wait --timeout too (new groups wait 30 minutes unless told): with
    rank 1 stopped, every other rank gives up within seconds, each with one sentence."""
    command = [sys.executable, SCRIPT, *SIZE, "--steps", "100000", "--data-parallel", "2", "--micro-batches", "2",
               "--timeout", "3"]
    ranks = start_ranks(command, 4, tmp_path)
    last = tmp_path / "stdout3"  # the last rank prints the loss
    while not last.exists() or "step" not in last.read_text():
        assert all(rank.poll() is None for rank in ranks), (tmp_path / "stderr0").read_text()
        time.sleep(0.1)
    os.kill(ranks[1].pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        codes = wait_ranks([ranks[0], ranks[2], ranks[3]], timeout=30)
    finally:
        ranks[1].kill()
        ranks[1].wait()
    assert codes == [1, 1, 1] and time.monotonic() - started < 20
    errors = [(tmp_path / f"stderr{rank}").read_text() for rank in (0, 2, 3)]
    for rank, error in zip((0, 2, 3), errors):
        sentences = [line for line in error.splitlines() if line.startswith("error:")]
        assert len(sentences) == 1 and sentences[0].startswith(f"error: rank {rank} gave up in "), error
        assert "Traceback" not in error, error
    assert any("waiting for rank 1" in error or "waiting for its copies" in error for error in errors), errors


def test_all_reduce_span_counts_its_launch(monkeypatch):
    """The table's all-reduce time starts before the requests are posted: launching them is part of it; and the
    requests started together (07's, a tensor each) are one span, from the first launch to the last wait."""
    monkeypatch.setattr(harness.meters.recorder, "pending", [])
    monkeypatch.setattr(harness.collectives, "_open", {})
    launch_seconds = 0.05
    done = types.SimpleNamespace(wait=lambda: True)
    monkeypatch.setitem(harness.collectives._torch, "all_reduce",
                        lambda *args, **kwargs: time.sleep(launch_seconds) or done)
    all_reduce = harness.collectives._timed("all_reduce")  # what the layer puts in dist.all_reduce's place
    requests = [all_reduce(torch.zeros(3), group="dp", async_op=True) for _ in range(3)]
    for request in requests:
        request.wait()
    [span] = harness.meters.recorder.pending
    assert span.kind == "allreduce" and span.end - span.start >= 3 * launch_seconds
