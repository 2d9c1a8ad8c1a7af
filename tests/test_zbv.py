"""ZB-V (06): the baseline's gradients on every shape of V, PyTorch's order of F, I and W, the in-flight
and held-bytes theory, the bubble under pacing against 05's, and bad input in one sentence."""


import pytest
from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

import common
import schedules
from tests.launch import (
    MEMORY,
    SYNC,
    assert_matches,
    assert_refused,
    case_ids,
    paced_theory,
    pipelined,
    settled,
    size,
    torch_order,
)
from theory import replay, zbv_inflight
from tools.held import held_count

SCRIPT = "06_zbv.py"
PACE = ("--pace", "50")  # ms: 6m + n - 1 paced units, each with about a millisecond of messaging on this machine


# (world size, micro-batches, layers, flags); 0 ranks: plain python, a world of one whose two chunks hand
# over in memory. m below, at and above n, 2n - 1 (what the rule needs without holes) and up to 3n; 3, 4
# and 7 micro-batches split 10 samples unevenly; 7 and 9 layers, which 2n does not divide. The paced cases
# (m = 2n) also give the bubble. A representative set runs under --sync-sends.
CASES = [
    (0, 3, 7, ()), (2, 1, 7, ()), (2, 3, 7, SYNC), (2, 4, 7, PACE), (2, 6, 7, SYNC),
    (3, 2, 7, SYNC), (3, 4, 7, ()), (3, 6, 7, PACE), (3, 7, 7, SYNC),
    (4, 3, 9, SYNC), (4, 4, 9, ()), (4, 7, 9, ()), (4, 8, 9, PACE), (4, 10, 9, SYNC),
]


def zbv(runs, world, micro_batches, layers=7, *flags):
    return pipelined(runs, SCRIPT, world, micro_batches, *flags, size=size(layers))


@pytest.mark.parametrize("world,micro_batches,layers,flags", CASES, ids=case_ids(CASES, "n", "m", "L"))
def test_matches_baseline(runs, world, micro_batches, layers, flags):
    baseline = runs("00_baseline.py", 0, *size(layers))
    run = zbv(runs, world, micro_batches, layers, *flags)
    assert_matches(run, baseline)
    # together the ranks' files hold every parameter exactly once; rank r holds stages r and 2n - 1 - r
    names = [name for rank_names in run.grad_files for name in rank_names]
    assert sorted(names) == sorted(baseline.grads) and len(run.grad_files) == max(world, 1)
    n = max(world, 1)
    assert [len(chunks) for chunks in run.summary["stage_layers"]] == [2] * n
    assert run.summary["stage_layers"][0][1][1] == layers  # rank 0's chunk 1 ends the model: the head


@pytest.mark.parametrize("world,micro_batches,layers,flags", CASES, ids=case_ids(CASES, "n", "m", "L"))
def test_schedule_is_pytorchs_zbv(runs, world, micro_batches, layers, flags):
    """Every rank runs F, I and W in PyTorch's ZB-V order, every step, and keeps the theory's chunks in flight."""
    run = zbv(runs, world, micro_batches, layers, *flags)
    n = max(world, 1)
    spans = [e for e in run.trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "wait"]
    for rank in range(n):
        for step in range(3):
            mine = sorted((e for e in spans if e["pid"] == rank and e["args"]["step"] == step), key=lambda e: e["ts"])
            order = [(e["cat"], e["args"]["chunk"], e["args"]["micro_batch"]) for e in mine]
            assert order == torch_order(ScheduleZBVZeroBubble, n, micro_batches, 2, "v")[rank], (rank, step)
    theory = [zbv_inflight(n, micro_batches, rank) for rank in range(n)]
    assert run.summary["peak_inflight_microbatches"] == theory
    assert run.summary["expected_inflight_microbatches"] == theory
    assert run.summary["bubble_theory"] == pytest.approx(paced_theory(schedules.zbv(n, micro_batches), "v", layers))


def test_held_bytes_are_the_theory(runs):
    """Every rank's peak held bytes are the V's count (tools.held.held_count over its table), exactly, and the largest
    is below 05's."""
    world, m, rows, hidden, layers = 4, 8, 2, 24, 16
    summary = pipelined(runs, SCRIPT, world, m, size=MEMORY).summary
    unit = rows * hidden * 8  # one rows x hidden float64 tensor
    theory = held_count(schedules.zbv(world, m), "v", [layers // (2 * world)] * 2 * world, rows, hidden)
    assert [held / unit for held in summary["peak_held_bytes"]] == pytest.approx(theory, abs=1e-9)
    zero_bubble = pipelined(runs, "05_zero_bubble.py", world, m, size=MEMORY).summary
    assert max(summary["peak_held_bytes"]) < max(zero_bubble["peak_held_bytes"])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_paced_bubble_is_the_theory_and_below_05s(runs, again, world):
    """Every span padded to 50 ms (tests.launch.settled): the busiest rank's bubble is the theory's,
    (n - 1) / (6m + n - 1) at m = 2n, within 0.03, and below 05's measured the same way."""
    m, layers = 2 * world, 7 if world < 4 else 9
    theory = paced_theory(schedules.zbv(world, m), "v", layers)  # zbv_bubble were the stages' costs equal
    def start(runner, pace):
        return zbv(runner, world, m, layers, *pace)

    summary = settled(runs, again, start, 50, theory).summary
    assert summary["paced_overruns"] == 0
    assert summary["bubble_at_costs"] == pytest.approx(theory, abs=0.01), "its order, replayed"
    assert summary["bubble_busiest"] == pytest.approx(theory, abs=0.03)
    zero_bubble = pipelined(runs, "05_zero_bubble.py", world, m, *PACE, size=size(layers)).summary
    assert summary["bubble_busiest"] < zero_bubble["bubble_busiest"]


@pytest.mark.parametrize("ranks,flags,words", [
    (1, ("--virtual-stages", "2"), ("unrecognized arguments: --virtual-stages 2",)),
    (2, ("--layers", "3"), ("2 ranks x 2 virtual stages", "3 layers", "--layers 4 or more", "fewer ranks")),
])
def test_bad_input(tmp_path, ranks, flags, words):
    error = assert_refused(tmp_path, SCRIPT, ranks, *flags, words=words)
    assert "virtual-stages" not in error or ranks == 1


@pytest.mark.parametrize("name,placement,num_chunks", [("zbv", "v", 2), ("zb-h1", "loop", 1),
                                                       ("interleaved-zero-bubble", "loop", 2)])
def test_unit_spans_are_the_replay(monkeypatch, name, placement, num_chunks):
    """06 places its sends and receives by common.unit_spans, a short simulation at one unit an F, I or W: it must
    give every computation the start and end that theory.replay (09's, the theory's) gives at those costs, or 06
    would post in another order than the one its theory and its NCCL safety argument replay."""
    for num_ranks in range(1, 6):
        monkeypatch.setattr(common, "_num_ranks", num_ranks)
        monkeypatch.setattr(common, "_num_chunks", num_chunks)
        monkeypatch.setattr(common, "_placement", placement)
        for micro_batches in range(1, 3 * num_ranks + 2):
            tables = schedules.table(name, num_ranks, micro_batches, num_chunks)
            assert common.unit_spans(tables) == replay(tables, common.stage_of, num_ranks * num_chunks), \
                (num_ranks, micro_batches)


def test_unit_spans_refuse_a_schedule_that_cannot_run(monkeypatch):
    monkeypatch.setattr(common, "_num_ranks", 2)
    monkeypatch.setattr(common, "_num_chunks", 1)
    monkeypatch.setattr(common, "_placement", "loop")
    stuck = [[("backward", 0, 0), ("forward", 0, 0)], [("forward", 0, 0), ("backward", 0, 0)]]  # I before its input
    with pytest.raises(AssertionError, match="cannot run"):
        common.unit_spans(stuck)
