"""What the scripts report about themselves: in-flight micro-batches, activation memory,
the trace and the timeline, checked against the schedule's theory."""

import subprocess

import pytest

from conftest import ENV, HERE, SIZE, pipelined, torchrun

# 12 samples in 6 equal micro-batches on 3 stages: every micro-batch holds the same bytes.
EVEN = SIZE[:4] + ("--batch-size", "12") + SIZE[6:]


@pytest.mark.parametrize("world,micro_batches", [(4, 2), (3, 3), (4, 7)])
def test_inflight_is_the_theory(runs, world, micro_batches):
    gpipe = pipelined(runs, "02_gpipe.py", world, micro_batches).summary
    one_f_one_b = pipelined(runs, "03_1f1b.py", world, micro_batches).summary
    assert gpipe["peak_inflight_microbatches"] == [micro_batches] * world
    assert one_f_one_b["peak_inflight_microbatches"] == [min(world - rank, micro_batches) for rank in range(world)]


def test_naive_keeps_one_micro_batch(runs):
    assert pipelined(runs, "01_naive.py", 4, 1).summary["peak_inflight_microbatches"] == [1] * 4


def test_activation_memory_follows_inflight(runs):
    gpipe = pipelined(runs, "02_gpipe.py", 3, 6, EVEN).summary
    one_f_one_b = pipelined(runs, "03_1f1b.py", 3, 6, EVEN).summary
    for rank in range(3):
        kept, kept_all = one_f_one_b["peak_activation_bytes"][rank], gpipe["peak_activation_bytes"][rank]
        assert 0 < kept < kept_all
        # each micro-batch holds the same bytes, so the bytes are in the ratio of the counts
        assert kept * 6 == kept_all * one_f_one_b["peak_inflight_microbatches"][rank], (rank, kept, kept_all)


def test_activation_bytes_are_the_saved_activations(runs):
    """Stage 1 of 4 holds 2 blocks (layers 2-3 of 7); per micro-batch it saves its input and each
    block's ReLU output (which the next Linear saves again, counted once): 3 tensors of
    rows x hidden float64. Weights are not activations."""
    run = pipelined(runs, "01_naive.py", 4, 1)
    assert run.summary["stage_layers"][1] == [2, 4]
    assert run.summary["peak_activation_bytes"][1] == 3 * 10 * 24 * 8


def test_trace_has_a_span_per_micro_batch(runs):
    world, micro_batches = 4, 7
    run = pipelined(runs, "03_1f1b.py", world, micro_batches)
    events = run.trace["traceEvents"]
    assert sorted(e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name") == list(range(world))
    for rank in range(world):
        for step in range(3):
            for kind in ("forward", "backward"):
                spans = [e["args"]["micro_batch"] for e in events
                         if e["ph"] == "X" and e["pid"] == rank and e["cat"] == kind and e["args"]["step"] == step]
                assert sorted(spans) == list(range(micro_batches)), (rank, step, kind, spans)
    # one clock: on every rank, a micro-batch's forward starts after the previous stage's ended
    forward = {(e["pid"], e["args"]["step"], e["args"]["micro_batch"]): e for e in events if e.get("cat") == "forward"}
    for (rank, step, micro_batch), span in forward.items():
        if rank > 0:
            previous = forward[(rank - 1, step, micro_batch)]
            assert span["ts"] >= previous["ts"] + previous["dur"]


# Rank 1 plays a rank on another machine, whose clock reads 1000 s ahead of rank 0's.
CLOCKS = """
import os, sys, time
sys.path.insert(0, {here!r})
import common
if os.environ["RANK"] == "1":
    common._machine_id = lambda: "another machine"
    perf_counter = time.perf_counter
    time.perf_counter = lambda: perf_counter() + 1000.0
common.setup(common.parse_args("clocks"))
with open(os.path.join({out!r}, "offset" + os.environ["RANK"]), "w") as file:
    file.write(repr(common._clock_offset))
common.finish()
"""


def test_clock_offset_is_measured_across_machines(tmp_path):
    script = tmp_path / "clocks.py"
    script.write_text(CLOCKS.format(here=HERE, out=str(tmp_path)))
    result = subprocess.run(torchrun(3, str(script), "--threads", "1"), env=ENV, capture_output=True, text=True,
                            timeout=60)
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


def test_summary_fields(runs):
    summary = pipelined(runs, "03_1f1b.py", 4, 4).summary
    assert summary["bubble_theory"] == pytest.approx(3 / 7)
    for key in ("compute_ms", "idle_ms", "peak_inflight_microbatches", "peak_activation_bytes"):
        assert len(summary[key]) == 4
    assert 0 <= summary["bubble_measured"] <= 1
    assert summary["bubble_measured"] == pytest.approx(sum(summary["bubble_per_rank"]) / 4)


def test_overhead_instruments_even_steps_only(runs):
    run = runs("02_gpipe.py", 3, *SIZE, "--steps", "5", "--micro-batches", "3", "--overhead")
    assert {event["args"]["step"] for event in run.trace["traceEvents"] if event["ph"] == "X"} == {0, 2, 4}
    assert run.summary["step_ms_median"] > 0 and run.summary["step_ms_median_bare"] > 0
    assert run.summary["peak_inflight_microbatches"] == [3, 3, 3]
    assert "timeline of step 4" in run.stdout and "--overhead:" in run.stdout
