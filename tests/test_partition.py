"""Stages that cost what they hold: --classes K makes the head a hidden x K matrix, --partition shares the blocks
out (even, given, or balanced by the replay at the stages' counted costs). Every script gives the baseline's
gradients at every partition and placement, chunks included; the balanced split is the exhaustive best; a paced
run with a heavy head waits on its last stage as the replay says; bad input is one sentence."""

import json

import pytest

import schedules
import theory
from tests.launch import (
    SYNC,
    assert_matches,
    case_ids,
    paced_theory,
    python,
    refusal,
    settled,
    size,
)

HEAVY = ("--classes", "96")  # at --hidden 24 the head is 4 blocks' worth

# (script, world, micro-batches, flags): every script, the loop and the V, chunks; counts given (a last stage that
# holds the head alone among them) and balanced, at a heavy head and at the default one; some under --sync-sends.
CASES = [
    ("01_naive.py", 3, 1, ("--partition", "3,3,1", *HEAVY)),
    ("02_gpipe.py", 4, 4, ("--partition", "1,2,4,0", *HEAVY)),
    ("03_1f1b.py", 2, 3, ("--partition", "balanced", *HEAVY, *SYNC)),
    ("04_interleaved_1f1b.py", 2, 4, ("--virtual-stages", "2", "--partition", "balanced", *HEAVY)),
    ("04_interleaved_1f1b.py", 2, 3, ("--virtual-stages", "2", "--partition", "3,1,2,1", *SYNC)),
    ("05_zero_bubble.py", 2, 5, ("--partition", "balanced", *HEAVY, *SYNC)),
    ("06_zbv.py", 2, 4, ("--partition", "1,2,3,1", *HEAVY)),
    ("06_zbv.py", 2, 5, ("--partition", "balanced", *HEAVY, *SYNC)),
    ("07_pp_dp.py", 4, 2, ("--data-parallel", "2", "--partition", "5,2", *HEAVY)),
    ("08_3d.py", 4, 3, ("--tensor-parallel", "2", "--partition", "balanced", *HEAVY, *SYNC)),
    ("09_any_schedule.py", 2, 4, ("--schedule", "dualpipev", "--partition", "2,2,2,1", *HEAVY, *SYNC)),
    ("09_any_schedule.py", 2, 4, ("--schedule", "interleaved-zero-bubble", "--partition", "balanced", *HEAVY)),
]


def blocks_of(flags, script, world, micro_batches):
    """The blocks per stage a case asks for: its counts, or theory.balanced over its table."""
    given = flags[flags.index("--partition") + 1]
    name = flags[flags.index("--schedule") + 1] if "--schedule" in flags else {
        "01": "gpipe", "02": "gpipe", "03": "1f1b", "04": "interleaved-1f1b", "05": "zb-h1", "06": "zbv",
        "07": "1f1b", "08": "1f1b"}[script[:2]]
    n = world // (2 if "--data-parallel" in flags or "--tensor-parallel" in flags else 1)
    chunks = int(flags[flags.index("--virtual-stages") + 1]) if "--virtual-stages" in flags else None
    found = schedules.load(name, n, micro_batches, chunks)
    if given != "balanced":
        return [int(count) for count in given.split(",")]
    stages = n * found.num_chunks

    def stage_of(rank, chunk):
        return theory.stage(found.placement, n, rank, chunk)

    classes = int(flags[flags.index("--classes") + 1]) if "--classes" in flags else 10
    return theory.balanced(7, found.tables, stage_of, stages, 24, classes)


@pytest.mark.parametrize("script,world,micro_batches,flags", CASES, ids=case_ids(CASES, "", "n", "m"))
def test_matches_baseline(runs, script, world, micro_batches, flags):
    """The baseline's gradients (float64, to 1e-10) at every partition; the summary's split is the one asked for."""
    classes = flags[flags.index("--classes"):flags.index("--classes") + 2] if "--classes" in flags else ()
    baseline = runs("00_baseline.py", 0, *size(7), *classes)
    micro = () if script == "01_naive.py" else ("--micro-batches", str(micro_batches))
    run = runs(script, world, *size(7), *micro, *flags)
    assert_matches(run, baseline)
    assert run.summary["blocks"] == blocks_of(flags, script, world, micro_batches)
    assert run.summary["partition"] == flags[flags.index("--partition") + 1]
    starts = [sum(run.summary["blocks"][:stage]) for stage in range(len(run.summary["blocks"]))]
    held = [pair if isinstance(pair[0], int) else pair[0] for pair in run.summary["stage_layers"]]
    assert all(first in starts for first, _ in held)


@pytest.mark.parametrize("classes", [10, 96, 1000])
@pytest.mark.parametrize("name,world,micro_batches,layers", [
    ("1f1b", 2, 4, 7), ("1f1b", 4, 8, 9), ("zb-h1", 3, 6, 8), ("gpipe", 3, 3, 6), ("zbv", 2, 4, 7),
    ("interleaved-1f1b", 2, 4, 6), ("dualpipev", 2, 5, 5), ("interleaved-zero-bubble", 2, 4, 7)])
def test_balanced_is_the_exhaustive_best(name, world, micro_batches, layers, classes):
    """theory.balanced's step is the least of every split's, by its exhaustive pass and by its method (exact on
    the slowest stage, the replay choosing among the best), on small layouts."""
    found = schedules.load(name, world, micro_batches, None)
    stages = world * found.num_chunks

    def stage_of(rank, chunk):
        return theory.stage(found.placement, world, rank, chunk)

    def step(blocks):
        spans = theory.replay(found.tables, stage_of, stages, theory.counted_costs(blocks, 24, classes))
        return max(end for _, end in spans.values())

    every = list(theory._splits(layers, stages))
    assert len(every) == len({tuple(blocks) for blocks in every}) and all(sum(blocks) == layers for blocks in every)
    best = min(map(step, every))
    assert step(theory.balanced(layers, found.tables, stage_of, stages, 24, classes)) == pytest.approx(best)
    assert step(theory.balanced(layers, found.tables, stage_of, stages, 24, classes, exhaustive=False)) == \
        pytest.approx(best)


def test_a_heavy_head_stalls_the_even_split_and_balanced_fixes_it(runs, again):
    """Paced at 50 ms, 03 on 2 ranks with a head 4 blocks' worth: at the even split (4 + 3 blocks) rank 0 waits on
    rank 1 (its bubble the larger), each bubble within 0.03 of the replay at --pace's spans; the summary names
    the last stage as the bound and the printed line the flag; balanced's measured step over even's is the
    replay's within 0.05 (both run again at twice the pace, twice more at most, while noise spoils the ratio)."""
    def start(partition):
        def launch(runner, pace):
            return runner("03_1f1b.py", 2, *size(7), "--micro-batches", "4", *HEAVY, "--partition", partition, *pace)
        return launch

    table = schedules.one_f_one_b(2, 4)

    def step(blocks):
        spans = theory.paced_spans(theory.counted_costs(blocks, 24, 96))
        return max(end for _, end in theory.replay(table, lambda rank, chunk: rank, 2, spans).values())

    first, pace = runs, 50
    for _ in range(3):
        even = settled(first, again, start("even"), pace)
        balanced = settled(first, again, start("balanced"), pace)
        predicted = step(balanced.summary["blocks"]) / step(even.summary["blocks"])
        ratio = balanced.summary["step_ms_median"] / even.summary["step_ms_median"]
        if abs(ratio - predicted) <= 0.05:
            break
        first, pace = again, pace * 2
    summary = even.summary
    assert summary["bounding_stage"] == 1 and summary["stage_costs"][1] > 1.5 * summary["stage_costs"][0]
    assert summary["bubble_theory"] == pytest.approx(paced_theory(table, "loop", 7, classes=96))
    assert summary["bubble_per_rank"][0] > summary["bubble_per_rank"][1] + 0.2
    assert all(abs(measured - theory) <= 0.03 for measured, theory in zip(summary["bubble_per_rank"],
                                                                           summary["bubble_theory_per_rank"]))
    assert abs(summary["bubble_busiest"] - summary["bubble_theory"]) <= 0.03
    assert "--partition balanced" in even.stdout and "--partition balanced" not in balanced.stdout
    assert predicted < 0.9
    assert ratio == pytest.approx(predicted, abs=0.05)


@pytest.mark.parametrize("world,flags,words", [
    (4, ("--partition", "1,2"), ("--partition 1,2 gives 2 stages", "has 4", "pass 4 counts")),
    (4, ("--partition", "1,2,3,4"), ("adds up to 10 blocks, not --layers 7",)),
    (4, ("--partition", "0,3,3,1"), ("leaves stage 0 with 0 blocks", "holds one at least")),
    (2, ("--partition", "3,x"), ("--partition takes even, balanced",)),
    (2, ("--partition", "2,2,2,1", "--virtual-stages", "3"), ("gives 4 stages", "has 6")),
    (2, ("--classes", "0"), ("--classes must be at least 1",)),
])
def test_bad_partition_is_one_sentence(tmp_path, world, flags, words):
    script = "04_interleaved_1f1b.py" if "--virtual-stages" in flags else "03_1f1b.py"
    code, stderr = refusal(tmp_path, script, world, *size(7), "--micro-batches", "2", *flags)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert all(word in errors[0] for word in words), errors[0]


def test_plan_costs_from_a_trace_are_each_stages_own(runs, tmp_path):
    """plan.py --layers --costs-from TRACE: each stage's own mean F, I and W in a heavy-head run of 05 (2 ranks,
    4 + 3 blocks), fitted as a block's cost and the head's: at the traced split the stage costs are the trace's
    means over the steps it measured (the first pays for warm-up), and the balanced split is no slower."""
    run = runs("05_zero_bubble.py", 2, *size(7), "--micro-batches", "4", *HEAVY)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(run.trace))
    result = python("tools/plan.py", "--stages", "2", "--micro-batches", "4", "--layers", "7", "--hidden", "24",
                    *HEAVY, "--costs-from", str(path), "--json", check=True)
    mine = [row for row in map(json.loads, result.stdout.splitlines()) if row["schedule"] == "zb-h1"]
    even = next(row for row in mine if row["partition"] == [4, 3])
    measured = run.trace["otherData"]["measured_steps"]
    events = [event for event in run.trace["traceEvents"] if event["ph"] == "X" and event["args"]["step"] in measured]
    assert measured and len(events) < len([event for event in run.trace["traceEvents"] if event["ph"] == "X"])
    for stage, cost in enumerate(even["stage_costs"]):
        for kind, value in cost.items():
            durations = [event["dur"] for event in events if event["cat"] == kind and event["args"]["stage"] == stage]
            assert value == pytest.approx(sum(durations) / len(durations)), (stage, kind)
    assert min(row["step"] for row in mine) <= even["step"]


def test_plan_prints_each_schedule_at_both_splits():
    """tools/plan.py --layers 16 --hidden 1024 --classes 16384 on 2 ranks: every schedule's row at the even split
    and at its balanced one, whose step is no longer; --json carries each row's partition and stage costs."""
    result = python("tools/plan.py", "--stages", "2", "--layers", "16", "--hidden", "1024", "--classes", "16384",
                    "--json", check=True)
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    for name in [*schedules.SCHEDULES, "search"]:
        mine = [row for row in rows if row["schedule"] == name]
        even = [row for row in mine if row["partition"] == [16 // (2 * row["chunks"])] * 2 * row["chunks"]]
        assert len(even) == 1 and 1 <= len(mine) <= 2, name
        assert min(row["step"] for row in mine) <= even[0]["step"]
        for row in mine:
            assert sum(row["partition"]) == 16
            costs = theory.counted_costs(row["partition"], 1024, 16384)
            assert row["stage_costs"] == [{kind: cost[kind] for kind in ("forward", "backward", "weight")}
                                          for cost in costs]
    one = {row["schedule"]: row for row in rows if row["partition"] == [16, 0]}
    assert one["1f1b"]["step"] < 0.8 * next(row["step"] for row in rows if row["schedule"] == "1f1b"
                                            and row["partition"] == [8, 8])
