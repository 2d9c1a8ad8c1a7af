"""What the scripts report about themselves, checked against the schedule's theory or a count by hand:
the peak in-flight micro-batches on every rank for every equivalence case; activation and held bytes that
follow them; a stage's activation bytes; the summary's bubble, recomputed from the trace; the trace's spans,
on one clock, across machines too; the timeline; the printed table, column by column; --overhead; the SVG."""

import os
import subprocess

import pytest

import schedules
from tests.launch import CASES, ENV, MEMORY, PROGRAMS, SIZE, case_ids, paced_theory, pipelined, torchrun
from theory import one_f_one_b_inflight

ROW_BYTES = 24 * 8  # one sample's activation: hidden 24, float64

# What each schedule keeps alive on rank r of n with m micro-batches.
INFLIGHT = {
    "01_naive.py": lambda n, m, rank: 1,
    "02_gpipe.py": lambda n, m, rank: m,
    "03_1f1b.py": one_f_one_b_inflight,
}


@pytest.mark.parametrize("script,world,micro_batches,flags", CASES, ids=case_ids(CASES, "", "n", "m"))
def test_inflight_is_the_theory(runs, script, world, micro_batches, flags):
    summary = pipelined(runs, script, world, micro_batches, *flags).summary
    theory = [INFLIGHT[script](world, micro_batches, rank) for rank in range(world)]
    assert summary["peak_inflight_microbatches"] == theory


def test_memory_follows_inflight(runs):
    """Autograd's saved bytes and everything a rank holds (saved, stashed, in transit), at 4 ranks,
    8 micro-batches and 16 layers: GPipe's grow with m, 1F1B's with min(n - r, m), on every rank; the
    activations exactly in the ratio of the counts, the held bytes within their theory. A schedule that
    keeps a stash it should have popped, or its sends until the step's end, fails it."""
    world, m, rows = 4, 8, 2
    gpipe = pipelined(runs, "02_gpipe.py", world, m, size=MEMORY).summary
    one_f_one_b = pipelined(runs, "03_1f1b.py", world, m, size=MEMORY).summary
    for rank in range(world):
        inflight = min(world - rank, m)
        kept, kept_all = one_f_one_b["peak_activation_bytes"][rank], gpipe["peak_activation_bytes"][rank]
        assert 0 < kept < kept_all
        # each micro-batch holds the same bytes, so the bytes are in the ratio of the counts
        assert kept * m == kept_all * inflight, (rank, kept, kept_all)
        per_micro_batch = kept_all // m
        held, held_all = one_f_one_b["peak_held_bytes"][rank], gpipe["peak_held_bytes"][rank]
        assert held >= kept and held_all >= kept_all  # autograd's saved tensors are held too
        # the theory (docs/design.md, *Memory*): the micro-batches in flight, plus at most 3 tensors in transit
        # (a gradient received and one sent, and the next forward's input)
        assert held <= inflight * per_micro_batch + 3 * rows * ROW_BYTES, (rank, held)
        assert held_all <= m * per_micro_batch + 3 * rows * ROW_BYTES, (rank, held_all)
        assert held * m <= (inflight + 1) * held_all, (rank, held, held_all)


def test_activation_bytes_are_the_saved_activations(runs):
    """Stage 1 of 4 holds 2 blocks (layers 2-3 of 7); per micro-batch it saves its input and each
    block's ReLU output (which the next Linear saves again, counted once): 3 tensors of
    rows x hidden float64. Weights are not activations."""
    run = pipelined(runs, "01_naive.py", 4, 1)
    assert run.summary["stage_layers"][1] == [2, 4]
    assert run.summary["peak_activation_bytes"][1] == 3 * 10 * 24 * 8


def test_table_is_the_summary(runs):
    """Each column of the printed table is the JSON summary's field of its header, on every rank (08 at
    2 x 2 x 2 has every column: the gradient all-reduce, the shards' all-reduces and the parameter bytes)."""
    run = runs("08_3d.py", 8, *SIZE, "--data-parallel", "2", "--tensor-parallel", "2", "--micro-batches", "3")
    summary, span = run.summary, lambda first, last: f"{first}-{last - 1}"
    size = lambda count: f"{count / 2**20:.2f} MiB" if count >= 2**20 else f"{count / 2**10:.1f} KiB"  # noqa: E731
    columns = [("rank", lambda rank: str(rank)), ("layers", lambda rank: span(*summary["stage_layers"][rank])),
               ("cost", lambda rank: f"{summary['counted_cost'][rank]:.4g}"),
               ("compute ms", lambda rank: f"{summary['compute_ms'][rank]:.1f}"),
               ("idle ms", lambda rank: f"{summary['idle_ms'][rank]:.1f}"),
               ("bubble", lambda rank: f"{summary['bubble_per_rank'][rank]:.3f}"),
               ("theory", lambda rank: f"{summary['bubble_theory_per_rank'][rank]:.3f}"),
               ("in flight", lambda rank: str(summary["peak_inflight_microbatches"][rank])),
               ("theory", lambda rank: str(summary["expected_inflight_microbatches"][rank])),
               ("activations", lambda rank: size(summary["peak_activation_bytes"][rank])),
               ("held", lambda rank: size(summary["peak_held_bytes"][rank])),
               ("all-reduce", lambda rank: f"{summary['allreduce_ms'][rank]:.1f}"),
               ("hidden", lambda rank: f"{summary['allreduce_hidden_ms'][rank]:.1f}"),
               ("TP", lambda rank: f"{summary['tp_allreduce_ms'][rank]:.1f}"),
               ("params", lambda rank: str(summary["parameter_bytes"][rank])),
               ("theory", lambda rank: str(summary["expected_parameter_bytes"][rank]))]
    lines = run.stdout.splitlines()
    first = next(index for index, line in enumerate(lines) if line.split()[:2] == ["rank", "layers"])
    cells = lambda line: [line[12 * column:12 * column + 11].strip() for column in range(len(columns))]  # noqa: E731
    assert cells(lines[first]) == [header for header, _ in columns]
    for rank in range(8):
        assert cells(lines[first + 1 + rank]) == [value(rank) for _, value in columns], rank


def test_trace_has_a_span_per_micro_batch(runs):
    """One process per rank, and one forward and one full backward span per micro-batch per rank per step,
    on one clock."""
    world, micro_batches = 4, 7
    run = pipelined(runs, "03_1f1b.py", world, micro_batches)
    events = run.trace["traceEvents"]
    assert sorted(e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name") == list(range(world))
    for rank in range(world):
        for step in range(3):
            for kind in ("forward", "full_backward"):
                spans = [e["args"]["micro_batch"] for e in events
                         if e["ph"] == "X" and e["pid"] == rank and e["cat"] == kind and e["args"]["step"] == step]
                assert sorted(spans) == list(range(micro_batches)), (rank, step, kind, spans)
    # one clock: on every rank, a micro-batch's forward starts after the previous stage's ended
    forward = {(e["pid"], e["args"]["step"], e["args"]["micro_batch"]): e for e in events if e.get("cat") == "forward"}
    for (rank, step, micro_batch), span in forward.items():
        if rank > 0:
            previous = forward[(rank - 1, step, micro_batch)]
            assert span["ts"] >= previous["ts"] + previous["dur"]


def test_clock_offset_is_measured_across_machines(tmp_path):
    """A rank posing as another machine, its clock 1000 s ahead, gets its offset measured within 0.05 s."""
    script = os.path.join(PROGRAMS, "clock_ahead.py")
    result = subprocess.run(torchrun(3, script, "--threads", "1"), env={**ENV, "OFFSET_FOLDER": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    offsets = [float((tmp_path / f"offset{rank}").read_text()) for rank in range(3)]
    assert offsets[0] == offsets[2] == 0.0  # rank 2 shares rank 0's machine, so its clock
    assert abs(offsets[1] + 1000.0) < 0.05  # off by at most half a round trip on this host


def test_timeline_has_a_row_per_rank(runs):
    run = pipelined(runs, "02_gpipe.py", 4, 4)
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("timeline of step 2"))
    rows = lines[start + 1:start + 5]
    assert [row.split("|")[0].split() for row in rows] == [["rank", str(rank)] for rank in range(4)]
    assert all("F" in row and "B" in row for row in rows)
    assert not lines[start + 5].startswith("rank")


def test_bubble_is_recomputed_from_the_trace(runs):
    """The summary's bubble, recomputed from the trace's spans: in each step after the first, the
    pipeline's window runs from the first forward anywhere to the last computation anywhere, and
    a rank is idle for whatever part of it it does not compute."""
    run = pipelined(runs, "03_1f1b.py", 4, 7)
    summary, events = run.summary, [e for e in run.trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "wait"]
    windows, busy = 0.0, [0.0] * 4
    for step in (1, 2):
        spans = [e for e in events if e["args"]["step"] == step]
        windows += max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)
        for e in spans:
            busy[e["pid"]] += e["dur"]
    bubbles = [1 - b / windows for b in busy]
    assert summary["bubble_theory"] == pytest.approx(paced_theory(schedules.one_f_one_b(4, 7), "loop", 7))
    assert summary["bubble_per_rank"] == pytest.approx(bubbles, abs=1e-6)
    assert summary["bubble_measured"] == pytest.approx(sum(bubbles) / 4, abs=1e-6)
    assert summary["compute_ms"] == pytest.approx([b / 2 / 1e3 for b in busy], rel=1e-6)


def test_overhead_instruments_even_steps_only(runs):
    run = runs("02_gpipe.py", 3, *SIZE, "--steps", "5", "--micro-batches", "3", "--overhead")
    assert {event["args"]["step"] for event in run.trace["traceEvents"] if event["ph"] == "X"} == {0, 2, 4}
    assert run.summary["step_ms_median"] > 0 and run.summary["step_ms_median_bare"] > 0
    assert run.summary["peak_inflight_microbatches"] == [3, 3, 3]
    assert "timeline of step 4" in run.stdout and "--overhead:" in run.stdout


def test_svg_draws_every_computation(runs, tmp_path):
    """--svg: a box per forward, backward and W of the last step, on every rank, and the theory in its title."""
    path = tmp_path / "run.svg"
    run = pipelined(runs, "05_zero_bubble.py", 2, 3, "--svg", str(path))
    picture = path.read_text()
    for colour, kind in (("#4e79a7", "forward"), ("#59a14f", "backward"), ("#f28e2b", "weight")):
        assert picture.count(f'fill="{colour}"') == 2 * 3, kind  # 2 ranks, 3 micro-batches
    assert f"theory {run.summary['bubble_theory']:.3f}" in picture
    assert picture.count("<text") >= 2 + 1  # the rank labels and the title


@pytest.mark.parametrize("script,world,flags,rows", [
    ("03_1f1b.py", 2, ("--micro-batches", "3"), [4, 3, 3]),
    ("07_pp_dp.py", 4, ("--micro-batches", "2", "--data-parallel", "2"), [3, 2]),
], ids=["03-m3", "07-d2-m2"])
def test_the_trace_records_its_rows(runs, script, world, flags, rows):
    """A trace says what it timed: the batch, the micro-batch count, and each micro-batch's rows in the first
    pipeline (10 samples: 4 + 3 + 3 in three; 07's first copy takes 5, cut 3 + 2)."""
    other = runs(script, world, *SIZE, *flags).trace["otherData"]
    assert (other["batch_size"], other["micro_batches"], other["rows"]) == (10, int(flags[1]), rows), other
