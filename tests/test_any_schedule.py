"""A schedule is a table (09): every table of schedules.py trains the baseline's model on real ranks (float64,
within 1e-10, layers and micro-batches that do not divide evenly, also under --sync-sends), holds the bytes
counted over its table, and lands on its replay's bubble when paced; bad input is one sentence. And the tables
are the numbered scripts' own orders: what 01-06 computed, read back from their traces, is their table."""

import json
import subprocess
import sys

import pytest

import schedules
from common import partition
from tests.launch import (
    HERE,
    MEMORY,
    SIZE,
    SYNC,
    assert_matches,
    assert_one_sentence,
    case_ids,
    pipelined,
    run_quietly,
    size,
    spoiled,
    torchrun,
)
from theory import busiest_bubble, held_count, parse_costs, peak_inflight, stage

SCRIPT = "09_any_schedule.py"
NAMES = list(schedules.SCHEDULES)


def chunks(name, virtual_stages=2):
    """The model chunks a rank holds under the schedule."""
    placement = schedules.SCHEDULES[name][1]
    return virtual_stages if schedules.takes_virtual_stages(name) else 2 if placement == "v" else 1


# (schedule, world size, micro-batches, layers, flags): at n = 3 every m in {1, n - 1, n, n + 1, 2n, 2n + 1}
# (10 samples: unequal micro-batches), every other one under --sync-sends; 7 layers, which 3 or 6 stages do
# not divide. Then other worlds, three chunks a rank, and plain python (a world of one) where a table takes it.
CASES = [(name, 3, m, 7, SYNC * (k % 2)) for name in NAMES for k, m in enumerate((1, 2, 3, 4, 6, 7))] + [
    ("dualpipev", 2, 4, 7, ()), ("dualpipev", 4, 8, 9, SYNC), ("dualpipev", 4, 5, 9, ()),
    ("interleaved-zero-bubble", 4, 5, 9, SYNC), ("looped-bfs", 2, 3, 7, SYNC), ("zbv", 0, 3, 7, ()),
    ("interleaved-zero-bubble", 2, 4, 7, ("--virtual-stages", "3")), ("interleaved-1f1b", 0, 3, 7, ()),
]


def any_schedule(runs, name, world, micro_batches, layers=7, *flags):
    return pipelined(runs, SCRIPT, world, micro_batches, "--schedule", name, *flags, size=size(layers))


@pytest.mark.parametrize("name,world,micro_batches,layers,flags", CASES, ids=case_ids(CASES, "", "n", "m", "L"))
def test_matches_baseline(runs, name, world, micro_batches, layers, flags):
    run = any_schedule(runs, name, world, micro_batches, layers, *flags)
    baseline = runs("00_baseline.py", 0, *size(layers))
    assert_matches(run, baseline)
    names = [name for rank_names in run.grad_files for name in rank_names]  # every parameter once
    assert sorted(names) == sorted(baseline.grads)
    given = int(flags[flags.index("--virtual-stages") + 1]) if "--virtual-stages" in flags else 2
    n, v = max(world, 1), chunks(name, given)
    tables = schedules.table(name, n, micro_batches, v)
    assert run.summary["virtual_stages"] == v
    assert run.summary["peak_inflight_microbatches"] == peak_inflight(tables)
    placement = schedules.SCHEDULES[name][1]
    replayed = busiest_bubble(tables, lambda rank, chunk: stage(placement, n, rank, chunk), n * v)
    assert run.summary["bubble_theory"] == pytest.approx(replayed)


def order(run, rank, step):
    """What `rank` computed in `step`, in order, as (kind, chunk, micro_batch), read from the run's trace."""
    spans = sorted((event for event in run.trace["traceEvents"] if event["ph"] == "X" and event["pid"] == rank
                    and event["cat"] in ("forward", "backward", "weight") and event["args"]["step"] == step),
                   key=lambda event: event["ts"])
    return [(event["cat"], event["args"]["chunk"], event["args"]["micro_batch"]) for event in spans]


# (script, its table, world, micro-batches, flags, size): runs the scripts' own tests also make (one launch
# each), with m below, at and above n and m that n does not divide.
SCRIPTS = [
    ("01_naive.py", lambda n, m: schedules.gpipe(n, 1), 4, 1, (), SIZE),
    ("02_gpipe.py", schedules.gpipe, 3, 2, SYNC, SIZE), ("02_gpipe.py", schedules.gpipe, 4, 7, (), SIZE),
    ("03_1f1b.py", schedules.one_f_one_b, 4, 2, (), SIZE), ("03_1f1b.py", schedules.one_f_one_b, 4, 7, (), SIZE),
    ("04_interleaved_1f1b.py", lambda n, m: schedules.interleaved_1f1b(n, m, 2), 3, 4, ("--virtual-stages", "2"),
     size(7)),
    ("04_interleaved_1f1b.py", lambda n, m: schedules.interleaved_1f1b(n, m, 3), 2, 3, ("--virtual-stages", "3",
                                                                                     *SYNC), size(7)),
    ("05_zero_bubble.py", schedules.zb_h1, 4, 2, (), SIZE), ("05_zero_bubble.py", schedules.zb_h1, 4, 7, (), SIZE),
    ("06_zbv.py", schedules.zbv, 3, 2, SYNC, size(7)), ("06_zbv.py", schedules.zbv, 4, 7, (), size(9)),
]


@pytest.mark.parametrize("script,table,world,micro_batches,flags,layers", SCRIPTS,
                         ids=[f"{script}-n{world}-m{m}" for script, _, world, m, *_ in SCRIPTS])
def test_tables_are_the_scripts_orders(runs, script, table, world, micro_batches, flags, layers):
    """A full backward of the table is the one backward span 01-04 record."""
    run = pipelined(runs, script, world, micro_batches, *flags, size=layers)
    expected = [[("backward" if kind == "full_backward" else kind, chunk, i) for kind, chunk, i in rank_table]
                for rank_table in table(world, micro_batches)]
    for step in range(3):
        assert [order(run, rank, step) for rank in range(world)] == expected, step


@pytest.mark.parametrize("name", NAMES)
def test_held_bytes_are_the_tables_count(runs, name):
    """Every rank's peak held bytes are the count over its table (theory.held_count), exactly: in-flight
    activations, pending W's and the tensors in transit, in rows x hidden float64 units."""
    world, m, rows, hidden, layers = 4, 8, 2, 24, 16
    summary = pipelined(runs, SCRIPT, world, m, "--schedule", name, size=MEMORY).summary
    num_chunks = chunks(name)
    blocks = [last - first for first, last in partition(layers, world * num_chunks)]
    theory = held_count(schedules.table(name, world, m, num_chunks), schedules.SCHEDULES[name][1], blocks, rows,
                        hidden)
    assert [held / (rows * hidden * 8) for held in summary["peak_held_bytes"]] == pytest.approx(theory, abs=1e-9)


# two measured steps: what one late wake-up of a rank adds to the bubble is halved
PACED = ("--layers", "8", "--hidden", "24", "--batch-size", "16", "--steps", "3", "--threads", "1",
         "--dtype", "float64", "--pace", "50")


def paced(runs, again, name, expected=None):
    """09's run of `name` paced, n = 4, m = 8: its summary, or a run's launched again (conftest's again) if noise
    may have spoiled the first (tests.launch.spoiled, against `expected`, its own bubble_theory if None)."""
    flags = (SCRIPT, 4, *PACED, "--micro-batches", "8", "--schedule", name)
    summary = runs(*flags).summary
    expected = summary["bubble_theory"] if expected is None else expected
    if spoiled(summary, expected):
        summary = again(*flags).summary
    return summary


@pytest.mark.parametrize("name", [*NAMES, "search"])
def test_paced_bubble_is_the_replay(runs, again, name):
    """Every span padded to 50 ms, n = 4, m = 8: the busiest rank's bubble is the table's unit-time replay
    (F, B and W one unit, a full backward two) within 0.03."""
    summary = paced(runs, again, name)
    assert summary["paced_overruns"] == 0
    assert abs(summary["bubble_busiest"] - summary["bubble_theory"]) <= 0.03, (summary["bubble_per_rank"],
                                                                               summary["bubble_theory"])


def test_plan_is_what_runs(runs, again):
    """tools/plan.py at n = 4, m = 8 and its default costs (F, B, W one unit): for every schedule and the search, its
    bubble within 0.03 of 09's paced one, and its peak in flight (micro-batches of a stage) 09's measured peak."""
    result = subprocess.run([sys.executable, "tools/plan.py", "--stages", "4", "--micro-batches", "8", "--json"],
                            cwd=HERE, capture_output=True, text=True, check=True)
    planned = {row["schedule"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert sorted(planned) == sorted([*NAMES, "search"])
    for name, row in planned.items():
        summary = paced(runs, again, name, row["bubble"])
        assert abs(row["bubble"] - summary["bubble_busiest"]) <= 0.03, (name, row["bubble"], summary["bubble_busiest"])
        assert [peak * row["chunks"] for peak in row["peak_inflight"]] == summary["peak_inflight_microbatches"], name


# (world size, micro-batches, flags): the search's tables, run by 09, at memories from 1F1B's (the default) to 2n,
# costs that favour either placement, under --sync-sends at every other one.
SEARCHES = [(2, 3, 7, ()), (3, 6, 7, ("--memory", "6", *SYNC)), (4, 8, 9, ("--costs", "1,2,1", "--memory", "8")),
            (4, 7, 9, ("--costs", "1,3,1", *SYNC)), (3, 4, 7, ("--costs", "2,2,1,0.5", "--memory", "2")),
            (3, 6, 7, ("--virtual-stages", "2", *SYNC)), (2, 5, 7, ("--virtual-stages", "3", "--costs", "1,2,1")),
            (0, 3, 7, ())]


def searched(summary, flags):
    """schedules.best_search for a run's --costs, --memory and --virtual-stages: (placement, chunks, tables)."""
    cost, message = parse_costs(summary["costs"])
    looped = int(flags[flags.index("--virtual-stages") + 1]) if "--virtual-stages" in flags else 1
    return schedules.best_search(summary["world_size"], summary["num_microbatches"], cost, summary["memory"],
                                 message, looped, summary["layers"] // summary["world_size"])


@pytest.mark.parametrize("world,micro_batches,layers,flags", SEARCHES, ids=case_ids(SEARCHES, "n", "m", "L"))
def test_search_matches_baseline(runs, world, micro_batches, layers, flags):
    """schedules.search's table, run by 09: the baseline's gradients, and the in-flight count of its table."""
    run = any_schedule(runs, "search", world, micro_batches, layers, *flags)
    assert_matches(run, runs("00_baseline.py", 0, *size(layers)))
    summary = run.summary
    placement, chunks, tables = searched(summary, flags)
    found = summary["placement"], summary["virtual_stages"], summary["peak_inflight_microbatches"]
    assert found == (placement, chunks, peak_inflight(tables))
    assert max(peak_inflight(tables)) <= summary["memory"] * chunks, "within --memory"


@pytest.mark.parametrize("flags", [(), ("--costs", "1,2,1", "--memory", "8"), ("--virtual-stages", "2")])
def test_search_holds_its_count(runs, flags):
    """The search's held bytes are the count over its table, exactly, as every table's."""
    world, m, rows, hidden, layers = 4, 8, 2, 24, 16
    summary = pipelined(runs, SCRIPT, world, m, "--schedule", "search", *flags, size=MEMORY).summary
    placement, chunks, tables = searched(summary, flags)
    blocks = [last - first for first, last in partition(layers, world * chunks)]
    theory = held_count(tables, placement, blocks, rows, hidden)
    assert [held / (rows * hidden * 8) for held in summary["peak_held_bytes"]] == pytest.approx(theory, abs=1e-9)


@pytest.mark.parametrize("ranks,flags,words", [
    (2, ("--schedule", "pipedream"), ("--schedule pipedream", *(f"{name}" for name in NAMES))),
    (0, ("--schedule", "dualpipev"), ("--schedule dualpipev on 1 rank", "start more ranks")),
    (2, ("--schedule", "1f1b", "--virtual-stages", "2"), ("--schedule 1f1b", "--virtual-stages", "leave it out")),
    (2, ("--schedule", "zbv", "--virtual-stages", "3"), ("--schedule zbv", "as a V", "leave it out")),
    (2, ("--schedule", "looped-bfs", "--virtual-stages", "4", "--layers", "7"), ("x 4 virtual stages", "--layers 8")),
    (2, ("--schedule", "zbv", "--memory", "4"), ("--memory is for --schedule search", "leave it out")),
    (2, ("--schedule", "search", "--memory", "0.5"), ("--schedule search on 2 ranks", "memory")),
    (2, ("--schedule", "search", "--costs", "1,two,1"), ("--costs takes F,B,W",)),
    (2, ("--schedule", "search", "--virtual-stages", "0"), ("--virtual-stages 0", "pass 1 or more")),
    (2, ("--schedule", "search", "--virtual-stages", "4", "--layers", "7"), ("x 4 virtual stages", "--layers 8")),
])
def test_bad_input(ranks, flags, words):
    """One sentence, on every rank's behalf, and no rank left waiting."""
    command = [sys.executable, SCRIPT, *flags] if ranks == 0 else torchrun(ranks, SCRIPT, *flags)
    result, seconds = run_quietly(command)
    assert_one_sentence(result, *words)
    assert seconds < 30


# --recompute on every kind of table: split (zb-h1, interleaved zero bubble), full (1f1b), overlapped (dualpipev).
RECOMPUTED = [("1f1b", 3, 4, ()), ("zb-h1", 2, 3, SYNC), ("dualpipev", 3, 6, ()),
              ("interleaved-zero-bubble", 2, 4, SYNC)]


@pytest.mark.parametrize("name,world,micro_batches,flags", RECOMPUTED, ids=case_ids(RECOMPUTED, "", "n", "m"))
def test_recompute_matches_baseline_and_holds_its_count(runs, name, world, micro_batches, flags):
    """--recompute: the baseline's gradients, and held bytes the count over the table with only inputs kept."""
    run = any_schedule(runs, name, world, micro_batches, 7, "--recompute", *flags)
    assert_matches(run, runs("00_baseline.py", 0, *size(7)))
    rows, hidden, layers = 16 // 8, 24, 16
    summary = pipelined(runs, SCRIPT, 4, 8, "--schedule", name, "--recompute", size=MEMORY).summary
    num_chunks = chunks(name)
    blocks = [last - first for first, last in partition(layers, 4 * num_chunks)]
    theory = held_count(schedules.table(name, 4, 8, num_chunks), schedules.SCHEDULES[name][1], blocks, rows, hidden,
                        recompute=True)
    assert [held / (rows * hidden * 8) for held in summary["peak_held_bytes"]] == pytest.approx(theory, abs=1e-9)


def test_svg_draws_every_computation(runs, tmp_path):
    """--svg: DualPipeV on 2 ranks, m = 4: a box per forward, B and W of the last step (a full backward is its B and
    its W), two chunks on each rank, and the theory in its title."""
    path = tmp_path / "dualpipev.svg"
    run = pipelined(runs, SCRIPT, 2, 4, "--schedule", "dualpipev", "--svg", str(path))
    picture = path.read_text()
    for colour, kind in (("#4e79a7", "forward"), ("#59a14f", "backward"), ("#f28e2b", "weight")):
        assert picture.count(f'fill="{colour}"') == 2 * 2 * 4, kind  # 2 ranks, 2 chunks, 4 micro-batches
    assert f"theory {run.summary['bubble_theory']:.3f}" in picture
