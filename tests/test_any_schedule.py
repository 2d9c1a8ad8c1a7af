"""A schedule is a table (09): every table of schedules.py, and a table in a file (PyTorch's compute_only CSV, as
PyTorch dumps its own and tools/plan.py --save writes the search's), trains the baseline's model on real ranks
(float64, within 1e-10, layers and micro-batches that do not divide evenly, also under --sync-sends), holds the
bytes counted over its table, and lands on its replay's bubble when paced; bad input, a bad file too, is one
sentence. And the tables are the numbered scripts' own orders: what 01-06 computed, read back from their traces,
is their table."""

import json

import pytest
import torch.distributed.pipelining.schedules as torch_schedules

import schedules
from common import partition
from harness.meters import COMPUTE
from tests.launch import (
    MEMORY,
    SIZE,
    SYNC,
    assert_matches,
    assert_refused,
    case_ids,
    paced_theory,
    pipelined,
    python,
    settled,
    size,
    torch_csv,
)
from theory import UNIT_COSTS, computing, counted_costs, paced_spans, peak_inflight, stage
from tools import search
from tools.costs import parse_costs
from tools.held import held_count, weight_share
from tools.plan import default_memory, default_weight_memory, to_csv

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
    assert run.summary["bubble_theory"] == pytest.approx(paced_theory(tables, schedules.SCHEDULES[name][1], layers,
                                                                      unit=UNIT_COSTS))


def order(run, rank, step):
    """What `rank` computed in `step`, in order, as (kind, chunk, micro_batch), read from the run's trace."""
    spans = sorted((event for event in run.trace["traceEvents"] if event["ph"] == "X" and event["pid"] == rank
                    and event["cat"] in COMPUTE and event["args"]["step"] == step),
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
    """A full backward of the table is the one full_backward span 01-04 record, an I its backward span: the trace
    names each kind as the table does."""
    run = pipelined(runs, script, world, micro_batches, *flags, size=layers)
    expected = table(world, micro_batches)
    for step in range(3):
        assert [order(run, rank, step) for rank in range(world)] == expected, step


@pytest.mark.parametrize("name", NAMES)
def test_held_bytes_are_the_tables_count(runs, name):
    """Every rank's peak held bytes are the count over its table (tools.held.held_count), exactly: in-flight
    activations, pending W's and the tensors in transit, in rows x hidden float64 units."""
    world, m, rows, hidden, layers = 4, 8, 2, 24, 16
    summary = pipelined(runs, SCRIPT, world, m, "--schedule", name, size=MEMORY).summary
    num_chunks = chunks(name)
    blocks = partition(layers, world * num_chunks)
    theory = held_count(schedules.table(name, world, m, num_chunks), schedules.SCHEDULES[name][1], blocks, rows,
                        hidden)
    assert [held / (rows * hidden * 8) for held in summary["peak_held_bytes"]] == pytest.approx(theory, abs=1e-9)


def holding(micro_batches, weights_at_once):
    """Two ranks' tables that run their F's first: then rank 1 each I and its W, and rank 0 the same
    (weights_at_once), so that its peak holds its micro-batches as their F's leave them, or all its I's and then
    its W's, so that its peak holds them as their I's do."""
    forwards = [("forward", 0, i) for i in range(micro_batches)]
    at_once = [step for i in range(micro_batches) for step in (("backward", 0, i), ("weight", 0, i))]
    later = [("backward", 0, i) for i in range(micro_batches)] + [("weight", 0, i) for i in range(micro_batches)]
    return [forwards + (at_once if weights_at_once else later), forwards + at_once]


@pytest.mark.parametrize("blocks", [3])
def test_weight_memory_is_what_a_run_holds(runs, tmp_path_factory, blocks):
    """This MLP's share of a micro-batch that its I leaves for its W (M_W / M_B in the zero-bubble paper, which calls
    I 'B'), measured in real runs of 09 on two ranks of `blocks` blocks: what rank 0's peak held bytes gain for each
    more micro-batch held as F leaves it, and as I does (from 4 micro-batches to 8, of 2 rows each, the rest of the
    peak cancels), one over the other. It is tools/held.py's weight_share, tools/plan.py's default --weight-memory
    for that model."""
    folder, unit = tmp_path_factory.mktemp("holding"), 2 * 24 * 8  # 2 rows of 24 float64
    size = ("--layers", str(2 * blocks), "--hidden", "24", "--steps", "2", "--threads", "1", "--dtype", "float64")
    growth = {}
    for weights_at_once in (True, False):
        peaks = []
        for m in (4, 8):
            path = folder / f"holding-{m}-{weights_at_once}.csv"
            path.write_text(to_csv(holding(m, weights_at_once), "loop"))
            summary = runs(SCRIPT, 2, *size, "--batch-size", str(2 * m), "--micro-batches", str(m),
                           "--schedule", str(path)).summary
            peaks.append(summary["peak_held_bytes"][0] / unit)
        growth[weights_at_once] = (peaks[1] - peaks[0]) / 4
    assert growth[True] == pytest.approx(blocks + 1, abs=1e-9)  # an input and each block's output
    share = growth[False] / growth[True]
    assert share == pytest.approx(weight_share(blocks), abs=1e-9)
    result = python("tools/plan.py", "--stages", "2", "--micro-batches", "4", "--layers", str(2 * blocks), "--json",
                    check=True)
    assert json.loads(result.stdout.splitlines()[0])["weight_memory"] == pytest.approx(share, abs=1e-9)


# two measured steps: what one late wake-up of a rank adds to the bubble is halved
PACED = ("--layers", "8", "--hidden", "24", "--batch-size", "16", "--steps", "3", "--threads", "1",
         "--dtype", "float64")
MODEL = ("--layers", "8", "--hidden", "24")  # tools/plan.py's flags for PACED's model: its stages' counted costs


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """tools/plan.py --save's file for a world, m and plan.py's other flags, written once a session: its path."""
    folder, paths = tmp_path_factory.mktemp("plans"), {}

    def save(world, micro_batches, *flags):
        key = world, micro_batches, flags
        if key not in paths:
            paths[key] = str(folder / f"plan{len(paths)}.csv")
            python("tools/plan.py", "--stages", str(max(world, 1)), "--micro-batches", str(micro_batches), *flags,
                   "--save", paths[key], check=True)
        return paths[key]

    return save


def paced(runs, again, name, expected=None, *flags):
    """09's run of `name` paced at 50 ms, n = 4, m = 8, and 09's `flags`: its summary (tests.launch.settled, against
    `expected`, its own bubble_theory if None)."""
    def start(runner, pace):
        return runner(SCRIPT, 4, *PACED, *pace, "--micro-batches", "8", "--schedule", name, *flags)

    return settled(runs, again, start, 50, expected).summary


# the search's tables as tools/plan.py saves them for PACED's model: within 1F1B's memory, and within less than it,
# an I leaving 0.3 of its micro-batch for its W
PACED_PLANS = {"search": (), "search-sharing": ("--memory", "2.5", "--weight-memory", "0.3", "--virtual-stages", "1")}


@pytest.mark.parametrize("name", [*NAMES, *PACED_PLANS])
def test_paced_bubble_is_the_replay(runs, again, saved, name):
    """Paced at 50 ms, n = 4, m = 8: the busiest rank's bubble is the table's replay at --pace's spans (F, I and W
    each its stage's cost over the mean stage's: the last, with the head, longer) within 0.03; the search's as
    tools/plan.py saves it."""
    summary = paced(runs, again, saved(4, 8, *MODEL, *PACED_PLANS[name]) if name in PACED_PLANS else name)
    assert summary["paced_overruns"] == 0
    assert abs(summary["bubble_busiest"] - summary["bubble_theory"]) <= 0.03, (summary["bubble_per_rank"],
                                                                               summary["bubble_theory"])


def test_overlap_paces_each_f_and_b_step_at_its_share(runs, again):
    """09 --schedule dualpipev --overlap 0.75, paced: each F&B step's parts take 0.75 of their spans, so each rank
    computes for its table's time at that overlap (theory.computing, within 3%: every span is a sleep), a twentieth
    and more below its time without one; and the busiest rank's bubble is the replay's at that overlap within 0.03."""
    n, m, overlap = 4, 8, 0.75
    summary = paced(runs, again, "dualpipev", None, "--overlap", str(overlap))
    tables = schedules.dualpipev(n, m)
    blocks = partition(8, 2 * n)
    spans = paced_spans(counted_costs(blocks, 24, 10), UNIT_COSTS)

    def stage_of(rank, chunk):
        return stage("v", n, rank, chunk)

    overlapped, whole = (computing(tables, stage_of, 2 * n, spans, share) for share in (overlap, 1.0))
    assert [ms / summary["pace_ms"] for ms in summary["compute_ms"]] == pytest.approx(overlapped, rel=0.03)
    assert all(busy > 1.05 * less for busy, less in zip(whole, overlapped))
    assert summary["paced_overruns"] == 0
    assert abs(summary["bubble_busiest"] - summary["bubble_theory"]) <= 0.03


def test_plan_is_what_runs(runs, again, saved):
    """tools/plan.py at n = 4, m = 8 and the paced model's counted costs (--layers 8 --hidden 24): for every schedule
    and the search, its row at the even split has its bubble within 0.03 of 09's paced one (pacing keeps the
    counted costs' proportions but for the loss's share, a hundredth), and its peak in flight (micro-batches of a
    stage, at this MLP's share, the default --weight-memory) its table's count at that share, whose count at whole
    micro-batches is 09's measured peak."""
    result = python("tools/plan.py", "--stages", "4", "--micro-batches", "8", *MODEL, "--json", check=True)
    planned = {row["schedule"]: row for row in map(json.loads, result.stdout.splitlines())
               if row["partition"] == partition(8, 4 * row["chunks"])}
    assert sorted(planned) == sorted([*NAMES, "search"])
    for name, row in planned.items():
        table = saved(4, 8, *MODEL) if name == "search" else name
        summary = paced(runs, again, table, row["bubble"])
        assert abs(row["bubble"] - summary["bubble_busiest"]) <= 0.03, (name, row["bubble"], summary["bubble_busiest"])
        if name == "search":
            with open(table) as file:
                tables = schedules.from_csv(file.read(), 8)[2]
        else:
            tables = schedules.table(name, 4, 8, row["chunks"])
        assert row["weight_memory"] == default_weight_memory(8, 4)
        assert [peak * row["chunks"] for peak in row["peak_inflight"]] == pytest.approx(
            peak_inflight(tables, row["weight_memory"])), name
        assert peak_inflight(tables) == summary["peak_inflight_microbatches"], name


# (world size, micro-batches, layers, plan.py's flags, 09's): the search's tables, saved by tools/plan.py and run by
# 09, at memories from 1F1B's (the default) to 2n, costs that favour either placement, --sync-sends at every other;
# then below 1F1B's memory where an I leaves a share of its micro-batch for its W, and judged by the window.
SEARCHES = [(2, 3, 7, (), ()), (3, 6, 7, ("--memory", "6"), SYNC), (4, 8, 9, ("--costs", "1,2,1", "--memory", "8"), ()),
            (4, 7, 9, ("--costs", "1,3,1"), SYNC), (3, 4, 7, ("--costs", "2,2,1,0.5", "--memory", "2"), ()),
            (3, 6, 7, ("--virtual-stages", "2"), SYNC), (2, 5, 7, ("--virtual-stages", "3", "--costs", "1,2,1"), ()),
            (0, 3, 7, (), ()), (4, 8, 9, ("--memory", "2.5", "--weight-memory", "0.3"), SYNC),
            (4, 8, 9, ("--memory", "2.5", "--weight-memory", "0.3"), ()),
            (3, 9, 7, ("--costs", "2,2,1,0.2", "--memory", "6", "--weight-memory", "0.4", "--objective", "window",
                       "--virtual-stages", "1"), SYNC)]


def searched(world, micro_batches, flags):
    """tools/search.best_search for plan.py's --costs, --memory, --virtual-stages, --weight-memory and --objective,
    and their defaults: (placement, chunks, tables)."""
    def flag(name, default):
        return flags[flags.index(name) + 1] if name in flags else default

    cost, message = parse_costs(flag("--costs", "1,1,1"))
    num_ranks = max(world, 1)
    share = float(flag("--weight-memory", default_weight_memory(int(flag("--layers", 16)), num_ranks)))
    memory = float(flag("--memory", default_memory(num_ranks, share)))
    return search.best_search(num_ranks, micro_batches, cost, memory, message, int(flag("--virtual-stages", 2)),
                              weight_memory=share, objective=flag("--objective", "step"))


@pytest.mark.parametrize("world,micro_batches,layers,plan_flags,flags", SEARCHES,
                         ids=case_ids(SEARCHES, "n", "m", "L"))
def test_a_saved_plan_matches_baseline(runs, saved, world, micro_batches, layers, plan_flags, flags):
    """The search's table, saved by tools/plan.py and run by 09 from the file: the baseline's gradients, and the
    placement, chunks and in-flight count of the search's own table."""
    path = saved(world, micro_batches, *plan_flags)
    run = any_schedule(runs, path, world, micro_batches, layers, *flags)
    assert_matches(run, runs("00_baseline.py", 0, *size(layers)))
    placement, chunks, tables = searched(world, micro_batches, plan_flags)
    summary = run.summary
    assert (summary["placement"], summary["virtual_stages"], summary["peak_inflight_microbatches"]) == (
        placement, chunks, peak_inflight(tables))


@pytest.mark.parametrize("plan_flags", [(), ("--costs", "1,2,1", "--memory", "8"), ("--virtual-stages", "2")])
def test_a_saved_plan_holds_its_count(runs, saved, plan_flags):
    """The search's held bytes are the count over its table, exactly, as every table's."""
    world, m, rows, hidden, layers = 4, 8, 2, 24, 16
    summary = pipelined(runs, SCRIPT, world, m, "--schedule", saved(world, m, *plan_flags), size=MEMORY).summary
    placement, chunks, tables = searched(world, m, plan_flags)
    blocks = partition(layers, world * chunks)
    theory = held_count(tables, placement, blocks, rows, hidden)
    assert [held / (rows * hidden * 8) for held in summary["peak_held_bytes"]] == pytest.approx(theory, abs=1e-9)


# PyTorch's own dumps (_dump_csv, format compute_only): (class, world, micro-batches, chunks, placement, flags)
DUMPS = [(torch_schedules.ScheduleZBVZeroBubble, 2, 4, 2, "v", ()),
         (torch_schedules.ScheduleZBVZeroBubble, 3, 5, 2, "v", SYNC),
         (torch_schedules.ScheduleInterleavedZeroBubble, 2, 4, 2, "loop", ()),
         (torch_schedules.ScheduleInterleavedZeroBubble, 3, 6, 2, "loop", SYNC),
         (torch_schedules.ScheduleDualPipeV, 2, 4, 2, "v", ()),
         (torch_schedules.ScheduleDualPipeV, 3, 6, 2, "v", SYNC),
         (torch_schedules.ScheduleLoopedBFS, 2, 3, 3, "loop", ())]


@pytest.mark.parametrize("schedule_class,world,micro_batches,num_chunks,placement,flags", DUMPS,
                         ids=[f"{dump[0].__name__}-n{dump[1]}-m{dump[2]}{'-sync' * bool(dump[5])}" for dump in DUMPS])
def test_a_table_pytorch_dumps_runs_exactly(runs, tmp_path_factory, schedule_class, world, micro_batches,
                                             num_chunks, placement, flags):
    """09 --schedule FILE.csv with the file PyTorch itself writes: the baseline's gradients in float64, and the
    in-flight count of that table."""
    path = tmp_path_factory.mktemp("dumps") / f"{schedule_class.__name__}.csv"
    text = torch_csv(path, schedule_class, world, micro_batches, num_chunks, placement)
    run = any_schedule(runs, str(path), world, micro_batches, 7, *flags)
    assert_matches(run, runs("00_baseline.py", 0, *size(7)))
    table = schedules.from_csv(text, micro_batches)
    assert (run.summary["placement"], run.summary["virtual_stages"]) == (placement, num_chunks)
    assert run.summary["peak_inflight_microbatches"] == peak_inflight(table.tables)


# bad files at 2 ranks, --micro-batches 1 unless the flags say: their rows, 09's other flags, the words said
BAD_FILES = [
    (["0F0,0X0", "1F0,1B0"], (), ("cell '0X0' is no compute action",)),
    (["0F0,0B0,0F1,0B1", "1F0,1B0,1F1,1B1"], (), ("runs micro-batches 0 to 1: pass --micro-batches 2",)),
    (["0F0,0B0", "2F0,2B0"], (), ("hold stages [[0], [2]]", "the loop", "the V")),
    (["0F0,0I0", "1F0,1B0"], (), ("stage 0 runs micro-batch 0's F, I or B, and W 1, 1 and 0 times",)),
    (["0B0,0F0", "1F0,1B0"], (), ("rank 0 waits forever at 0B0's step",)),
    (["0F0,0B0", "1F0,1B0", "2F0,2B0"], (), ("3 rank(s)", "start as many")),
    (["0F0,3F0,3B0,0B0", "1F0,2F0,2B0,1B0"], ("--virtual-stages", "3"), ("places 2 chunk(s)", "--virtual-stages")),
    (None, (), ("cannot read it", "pass a compute_only CSV")),
]


@pytest.mark.parametrize("rows,flags,words", BAD_FILES, ids=[words[0][:24] for _, _, words in BAD_FILES])
def test_a_bad_table_file_is_one_sentence(tmp_path, rows, flags, words):
    """A malformed CSV: one sentence naming the file's fault, a non-zero exit, and no rank left waiting."""
    path = tmp_path / "table.csv"
    if rows is not None:
        path.write_text("\n".join(rows) + "\n")
    assert_refused(tmp_path, SCRIPT, 2, "--schedule", str(path), "--micro-batches", "1", *flags,
                   words=(f"--schedule {path} on 2 ranks", *words))


@pytest.mark.parametrize("ranks,flags,words", [
    (2, ("--schedule", "pipedream"), ("--schedule pipedream", *(f"{name}" for name in NAMES))),
    (1, ("--schedule", "dualpipev"), ("--schedule dualpipev on 1 rank", "start more ranks")),
    (2, ("--schedule", "1f1b", "--virtual-stages", "2"), ("--schedule 1f1b", "places 1 chunk(s) a rank")),
    (2, ("--schedule", "zbv", "--virtual-stages", "3"), ("--schedule zbv", "places 2 chunk(s) a rank")),
    (2, ("--schedule", "looped-bfs", "--virtual-stages", "4", "--layers", "7"), ("x 4 virtual stages", "--layers 8")),
    (2, ("--schedule", "interleaved-1f1b", "--virtual-stages", "0"), ("--virtual-stages must be at least 1",)),
    (2, ("--schedule", "search"), ("no schedule named 'search'", "gpipe")),
    (2, ("--schedule", "dualpipev", "--overlap", "0"), ("--overlap is 0", "at most 1")),
    (2, ("--schedule", "dualpipev", "--overlap", "1.5"), ("--overlap is 1.5", "at most 1")),
    (2, ("--schedule", "dualpipev", "--overlap", "0.6"), ("--overlap 0.6 is below 0.6667", "longer part")),
])
def test_bad_input(tmp_path, ranks, flags, words):
    """One sentence, on every rank's behalf (each finds it before it meets another: tests/test_failures.py shows
    them all stop)."""
    assert_refused(tmp_path, SCRIPT, ranks, *flags, words=words)


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
    blocks = partition(layers, 4 * num_chunks)
    theory = held_count(schedules.table(name, 4, 8, num_chunks), schedules.SCHEDULES[name][1], blocks, rows, hidden,
                        recompute=True)
    assert [held / (rows * hidden * 8) for held in summary["peak_held_bytes"]] == pytest.approx(theory, abs=1e-9)


def test_svg_draws_every_computation(runs, tmp_path):
    """--svg: DualPipeV on 2 ranks, m = 4: a box per F, I and W of the last step (a full backward is its I and
    its W), two chunks on each rank, and the theory in its title."""
    path = tmp_path / "dualpipev.svg"
    run = pipelined(runs, SCRIPT, 2, 4, "--schedule", "dualpipev", "--svg", str(path))
    picture = path.read_text()
    for colour, kind in (("#4e79a7", "forward"), ("#59a14f", "backward"), ("#f28e2b", "weight")):
        assert picture.count(f'fill="{colour}"') == 2 * 2 * 4, kind  # 2 ranks, 2 chunks, 4 micro-batches
    assert f"theory {run.summary['bubble_theory']:.3f}" in picture
