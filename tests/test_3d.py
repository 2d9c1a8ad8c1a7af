"""08: tensor parallelism inside each stage, a 3-D grid of d copies x n stages x t shards. Every layout gives
the baseline's gradients, losses and parameters; each shard starts from the baseline's slice of each weight;
the whole parameters keep the same bits on every shard and copy after every step; the shards' all-reduces,
the bytes they carry, the bytes sent and the parameter bytes are the formulas; --tensor-parallel 1 is 07 bit
for bit; paced at 2 stages x 2 shards, the busiest rank's bubble is 1F1B's. The checks catch a generator
seeded by rank and shards that sum in orders of their own. A two-node launch (a stage on each node) trains
like one; a stopped shard and each bad layout end with one sentence, and every rank stops."""

import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch

import common
import schedules
from tests.launch import (
    ENV,
    EXACT,
    HERE,
    SIZE,
    SYNC,
    assert_close,
    assert_matches,
    assert_one_sentence,
    case_ids,
    paced_theory,
    program,
    run_quietly,
    settled,
    start_ranks,
    torchrun,
    two_nodes,
    variant,
    wait_ranks,
)

SCRIPT, LAYERS, HIDDEN, ROWS, FLOAT64 = "08_3d.py", 7, 24, 10, 8  # SIZE's
# (copies, stages, shards, micro-batches, flags). 7 layers: 7 blocks on one stage (3 pairs and an odd block), 4
# and 3 on two stages, 3, 2 and 2 on three, so some stage ends with an odd block in every layout; 10 samples in
# 5 + 5 or 4 + 3 + 3; micro-batches below, at and above the stages; width 24 cut in 2 or 3; some under --sync-sends.
CASES = [
    (1, 1, 2, 3, ()), (1, 2, 2, 2, SYNC), (2, 2, 2, 3, ()), (1, 3, 2, 2, ()), (2, 1, 2, 4, SYNC), (1, 2, 3, 4, SYNC),
]
IDS = case_ids(CASES, "dp", "pp", "tp", "m")
def grid(runs, copies, stages, shards, micro_batches, *flags, script=SCRIPT):
    return runs(script, copies * stages * shards, *SIZE, "--data-parallel", str(copies), "--tensor-parallel",
                str(shards), "--micro-batches", str(micro_batches), *flags)


def place(rank, stages, shards):
    """(copy, stage, shard) of a rank of the world: rank (copy * stages + stage) * shards + shard."""
    return rank // shards // stages, rank // shards % stages, rank % shards


def blocks(stage, stages):
    base, leftover = divmod(LAYERS, stages)  # the leftover blocks go to the first stages
    return base + (stage < leftover)


def collectives(stage, stages, shards):
    """A micro-batch's all-reduces and gathers on one shard of a stage: each pair's g forward and f backward,
    an odd block's gather forward and f backward, but no f backward for the first stage's input, which needs
    no gradient; none with one shard."""
    return (2 * ((blocks(stage, stages) + 1) // 2) - (stage == 0)) * (shards > 1)


def share(copy, copies):
    return ROWS // copies + (copy < ROWS % copies)  # a pipeline's samples: one more in the first copies


@pytest.fixture(scope="module")
def baseline(runs):
    return runs("00_baseline.py", 0, *SIZE)


@pytest.mark.parametrize("copies,stages,shards,micro_batches,flags", CASES, ids=IDS)
def test_matches_baseline(runs, baseline, copies, stages, shards, micro_batches, flags):
    """Gradients and parameters gathered from the shards, written by shard 0 under the baseline's names."""
    run = grid(runs, copies, stages, shards, micro_batches, *flags)
    assert_matches(run, baseline)
    for rank, params in enumerate(run.rank_params):
        assert bool(params) == (rank % shards == 0), rank
        assert_close(params, {name: baseline.params[name] for name in params}, EXACT, f"rank {rank}'s parameters")
    names = [name for rank_names in run.grad_files for name in rank_names]
    assert sorted(names) == sorted(list(baseline.grads) * copies)  # each parameter once a copy, whole
    assert run.summary["world_size"] == copies * stages * shards and run.summary["tensor_parallel"] == shards


@pytest.mark.parametrize("copies,stages,shards,micro_batches,flags", CASES, ids=IDS)
def test_counts_are_the_formulas(runs, copies, stages, shards, micro_batches, flags):
    """Per rank and step: the shards' all-reduces and gathers and the bytes of the tensors they make, the
    bytes sent to other stages (each shard sends the whole activation forward and the whole gradient back),
    and the parameter bytes; 1F1B's in-flight counts and theory; every collective a span inside F or B."""
    run = grid(runs, copies, stages, shards, micro_batches, *flags)
    summary, world, row = run.summary, copies * stages * shards, HIDDEN * FLOAT64
    for rank in range(world):
        copy, stage, _ = place(rank, stages, shards)
        count = collectives(stage, stages, shards)
        assert summary["tp_allreduces"][rank] == micro_batches * count, rank
        assert summary["tp_allreduce_bytes"][rank] == share(copy, copies) * row * count, rank
        assert summary["sent_bytes"][rank] == share(copy, copies) * row * ((stage > 0) + (stage < stages - 1)), rank
        layers, head = blocks(stage, stages), (stage == stages - 1) * (HIDDEN + 1) * 10
        columns = (layers + 1) // 2  # the cut blocks' weights and the column-parallel biases, 1/t each
        parameters = (layers * HIDDEN * HIDDEN + columns * HIDDEN) // shards + (layers - columns) * HIDDEN + head
        assert summary["parameter_bytes"][rank] == summary["expected_parameter_bytes"][rank] == parameters * FLOAT64
        assert summary["peak_inflight_microbatches"][rank] == min(stages - stage, micro_batches)
        if stage < stages - 1:  # activations: the stage's input, each pair's slice and whole output, an odd block's
            pairs, odd = divmod(layers, 2)
            row_bytes = (HIDDEN + pairs * (HIDDEN + HIDDEN // shards) + odd * HIDDEN) * FLOAT64
            sizes = [len(rows) for rows in torch.arange(share(copy, copies)).tensor_split(micro_batches)]
            assert summary["peak_activation_bytes"][rank] == sum(sizes[:min(stages - stage, micro_batches)]) * row_bytes
    assert summary["bubble_theory"] == pytest.approx(paced_theory(schedules.one_f_one_b(stages, micro_batches), "loop",
                                                                  LAYERS))
    header = next(line for line in run.stdout.splitlines() if line.split()[:2] == ["rank", "layers"])
    assert header.split()[-3:] == ["TP", "params", "theory"]
    computations = [event for event in run.trace["traceEvents"] if event.get("cat") in ("forward", "full_backward")]
    for event in run.trace["traceEvents"]:
        if event.get("cat") == "tp_allreduce":
            assert any(outer["pid"] == event["pid"] and outer["ts"] <= event["ts"]
                       and event["ts"] + event["dur"] <= outer["ts"] + outer["dur"] for outer in computations), event


# Three shards, so that an all-reduce adds three numbers, whose order matters, and two copies of one stage.
EVERY_STEP_GRID = (2, 1, 3, 3)


def every_step(runs, tmp_path_factory, mutation=""):
    """A run of EVERY_STEP_GRID whose ranks write their parameters at the start and after every step."""
    folder = tmp_path_factory.mktemp("every_step")
    saved = program("save_every_step") + f"save_every_step({str(folder)!r})\n"
    script = variant(folder, SCRIPT, prepend=saved + mutation)
    return grid(runs, *EVERY_STEP_GRID, script=script), folder


def baseline_model():
    """The baseline's parameters as built, in the optimizer's order."""
    args = types.SimpleNamespace(layers=LAYERS, hidden=HIDDEN, classes=10, blocks=[LAYERS], seed=0, dtype="float64")
    return common.build_stage(args, 0, 1, "cpu")


def assert_slices_at_the_start(folder):
    """Shard k holds rows k of a column-parallel block's weight and bias (its even blocks on one stage), columns
    k of a row-parallel block's weight and its whole bias, and the whole head."""
    shards = EVERY_STEP_GRID[2]
    for shard in range(shards):
        start = torch.load(folder / f"start-rank{shard}.pt")
        for index, (name, whole) in enumerate(baseline_model().named_parameters()):
            layer = int(name.split(".")[1]) if name.startswith("blocks") else -1
            dim = None if layer < 0 or (layer % 2 and name.endswith("bias")) else layer % 2
            expected = whole if dim is None else whole.detach().chunk(shards, dim)[shard]
            assert torch.equal(start[index], expected), (shard, name)


def assert_same_bits_after_every_step(folder):
    """The whole parameters (the baseline's shape) are the same bits on every rank, the slices on every copy."""
    copies, _, shards, _ = EVERY_STEP_GRID
    model = baseline_model()
    for step in range(3):
        params = [torch.load(folder / f"step{step}-rank{rank}.pt") for rank in range(copies * shards)]
        for rank in range(copies * shards):
            for index, (name, whole) in enumerate(model.named_parameters()):
                same = 0 if params[0][index].shape == whole.shape else rank % shards
                assert torch.equal(params[rank][index], params[same][index]), (step, rank, name)


def test_whole_parameters_keep_the_same_bits(runs, baseline, tmp_path_factory):
    run, folder = every_step(runs, tmp_path_factory)
    assert_close(run.params, baseline.params, EXACT, "parameters after the last step")
    assert_slices_at_the_start(folder)
    assert_same_bits_after_every_step(folder)


def test_the_checks_catch_the_pitfalls(runs, baseline, tmp_path_factory):
    """Shards seeded by rank start from no slice of the baseline's; sums in each shard's own order stay within
    1e-10 of the baseline but leave the shards' whole parameters different bits."""
    _, folder = every_step(runs, tmp_path_factory, program("seeded_by_rank"))
    with pytest.raises(AssertionError):
        assert_slices_at_the_start(folder)
    run, folder = every_step(runs, tmp_path_factory, program("sum_in_own_order"))
    assert_close(run.params, baseline.params, EXACT, "parameters after the last step")
    with pytest.raises(AssertionError):
        assert_same_bits_after_every_step(folder)


def test_one_shard_is_07(runs):
    """--tensor-parallel 1: 07's gradients, parameters and losses bit for bit, and its step: on every rank
    and step the same spans in the same order, the same bytes sent and held."""
    flags = ("--data-parallel", "2", "--micro-batches", "2", *SYNC)
    pp_dp, three_d = runs("07_pp_dp.py", 4, *SIZE, *flags), grid(runs, 2, 2, 1, 2, *SYNC)
    for name, gradient in pp_dp.grads.items():
        assert torch.equal(three_d.grads[name], gradient), name
    for mine, theirs in zip(three_d.rank_params, pp_dp.rank_params):
        assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[name], theirs[name]) for name in theirs)
    assert three_d.summary["losses"] == pp_dp.summary["losses"]

    def order(run):
        events = sorted((event for event in run.trace["traceEvents"] if event["ph"] == "X"), key=lambda e: e["ts"])
        return sorted((e["pid"], e["args"]["step"], index, e["name"]) for index, e in enumerate(events))

    structure = [(rank, step, name) for rank, step, _, name in order(three_d)]
    assert structure == [(rank, step, name) for rank, step, _, name in order(pp_dp)]
    for key in ("sent_bytes", "peak_inflight_microbatches", "peak_activation_bytes", "parameter_bytes", "stage_layers"):
        assert three_d.summary[key] == pp_dp.summary[key], key
    assert "tp_allreduces" not in three_d.summary


def test_recompute(runs, baseline):
    """--recompute (07's, carried over): the baseline's numbers, and the backward's forward runs its collectives
    again: m (3 ceil(L / 2) - [s = 0]) a step."""
    run = grid(runs, 1, 2, 2, 3, "--recompute")
    assert_matches(run, baseline)
    expected = [3 * (3 * ((blocks(stage, 2) + 1) // 2) - (stage == 0)) for stage in (0, 0, 1, 1)]  # m = 3
    assert run.summary["tp_allreduces"] == expected


def test_paced_bubble_is_1f1b(runs, again, baseline):
    """--pace 50 at 2 stages x 2 shards: each F and B holds its shards' all-reduces and is padded to 50 ms as a
    whole. (A shard whose partner starts a span later waits for it inside the span: the first step, as the ranks
    start at different moments, can overrun the pace; it is not measured.)"""
    theory = paced_theory(schedules.one_f_one_b(2, 4), "loop", LAYERS)  # 1 / (4 + 2 - 1) were stages equal

    def start(runner, pace):
        return grid(runner, 1, 2, 2, 4, *pace)

    run = settled(runs, again, start, 50, theory)
    assert run.summary["bubble_theory"] == pytest.approx(theory)
    assert run.summary["bubble_at_costs"] == pytest.approx(theory, abs=0.01), "its order, replayed"
    assert abs(run.summary["bubble_busiest"] - theory) <= 0.03, run.summary["bubble_per_rank"]
    assert_close(run.grads, baseline.grads, EXACT, "paced gradients")


@pytest.mark.parametrize("world,flags,words", [
    (2, ("--tensor-parallel", "2", "--hidden", "25"), ("--tensor-parallel 2", "--hidden 25", "a multiple of 2")),
    (6, ("--data-parallel", "2", "--tensor-parallel", "2"), ("--data-parallel 2 x --tensor-parallel 2", "6 ranks",
                                                             "one of 1, 3")),
    (3, ("--tensor-parallel", "2"), ("--data-parallel 1 x --tensor-parallel 2", "3 ranks", ": start a multiple of 2")),
    (4, ("--tensor-parallel", "2", "--layers", "1"), ("4 ranks (2 shards a stage)", "1 layers", "--layers 2")),
    (1, ("--tensor-parallel", "0"), ("--tensor-parallel", "at least 1")),
])
def test_bad_layout(world, flags, words):
    """Each rank checks the flags before it meets any other: one process stands for them."""
    result = subprocess.run([sys.executable, SCRIPT, *flags], cwd=HERE, env={**ENV, "WORLD_SIZE": str(world)},
                            capture_output=True, text=True, timeout=30)
    assert_one_sentence(result, *words)


def test_bad_layout_stops_every_rank():
    result, seconds = run_quietly(torchrun(4, SCRIPT, "--tensor-parallel", "3"))
    assert_one_sentence(result, "--tensor-parallel 3", "4 ranks")
    assert seconds < 30


def test_two_nodes_train_like_one(runs):
    """A stage's shards on one node: ranks 0-1 (node 0) are stage 0, ranks 2-3 (node 1) stage 1; the shards'
    all-reduces stay inside the nodes, the pipeline's hops cross them."""
    flags = SIZE + ("--data-parallel", "1", "--tensor-parallel", "2", "--micro-batches", "2", *SYNC, "--json")
    (code0, out0, err0), (code1, _, err1) = two_nodes(SCRIPT, flags, flags)
    assert code0 == code1 == 0, err0 + err1
    two = json.loads([line for line in out0.splitlines() if line.startswith("{")][0])
    assert two["world_size"] == 4 and two["losses"] == grid(runs, 1, 2, 2, 2, *SYNC).summary["losses"]


def test_stuck_shard_times_out(tmp_path):
    """With shard 1 stopped, shard 0 gives up in the all-reduce that waits for it within seconds, in one sentence."""
    command = [sys.executable, SCRIPT, *SIZE, "--steps", "100000", "--tensor-parallel", "2", "--timeout", "3"]
    ranks = start_ranks(command, 2, tmp_path)
    while "step" not in (tmp_path / "stdout1").read_text():  # the last rank prints the loss
        assert all(rank.poll() is None for rank in ranks), (tmp_path / "stderr0").read_text()
        time.sleep(0.1)
    os.kill(ranks[1].pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        codes = wait_ranks([ranks[0]], timeout=30)
    finally:
        ranks[1].kill()
        ranks[1].wait()
    error = (tmp_path / "stderr0").read_text()
    assert codes == [1] and time.monotonic() - started < 20, error
    sentences = [line for line in error.splitlines() if line.startswith("error:")]
    assert len(sentences) == 1 and "error: rank 0 gave up in tp_allreduce waiting for the other shards" in error, error
