"""Plan a pipeline on paper: every schedule in schedules.py, and one searched for your costs and memory, replayed at
a stage's costs, one row each, the fastest first. No processes: each row is a replay (tools/costs.py).

    python tools/plan.py --stages 8 --micro-batches 32 --costs 1,2,1
    python tools/plan.py --stages 8 --micro-batches 32 --costs-from /tmp/trace.json --memory 8 --json
    python tools/plan.py --stages 4 --micro-batches 8 --costs 1,2,1 --save plan.csv --svg plan.svg
    python tools/plan.py --stages 2 --micro-batches 8 --layers 16 --hidden 1024 --classes 16384
    python tools/plan.py --stages 2 --micro-batches 1,2,4,8,16 --costs-from m1.json m4.json m16.json --batch-memory 1
    torchrun --nproc_per_node=4 09_any_schedule.py --schedule plan.csv --micro-batches 8

step: the pipeline's span, first start to last end, in cost units. bubble: the busiest rank's idle share of it, as a
script's bubble_theory. window: the zero-bubble paper's bubble rate, 1 - the busiest rank's work over the longest
rank's window (its first computation's start to its last's end), which leaves out a rank's wait before its first F
and after its last W. peak: activations alive at once, in micro-batches of a stage (a chunk of a rank holding v
chunks is 1/v of a stage), on the rank that holds most and on rank 0, an I leaving --weight-memory of its micro-batch
held for its W (this MLP's share unless given: above 1, so that an I adds to what its F held). messages: the tensors
a rank sends to another rank in a step, the most of any rank. search: tools/search.py on whichever placement is
better by --objective (the step, or the window): the loop at one chunk a rank or at --virtual-stages, or the V. It
is the row plan.py recommends (by its objective, never worse than a row that fits --memory): --save writes its
table as PyTorch's compute_only CSV, which 09 and PyTorch's runtime run.
With --layers, every stage costs what it holds (theory.counted_costs, in block forwards, or with --costs-from each
stage's own measured F, I and W, fitted as a block's and the head's; the search is run at the mean stage's), and
each row comes twice: at --partition's split (even unless given) and at its balanced split.
With --costs-from the traces of runs at two micro-batch counts or more (of this version: their spans carry their
rows), a block's F, I and W are fitted against a micro-batch's rows (tools/fit.py's fit_rows; the head at its
counted share of a block's), and --micro-batches may name several counts of one --batch-size: a row for each
schedule at each (micro_batches), and the best of them, the least run step within --batch-memory (a rank's peak in
batches of a stage).
"""

import argparse
import json
import math
import os
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the lesson's modules, and tools as a package
import common  # noqa: E402
import harness  # noqa: E402
import schedules  # noqa: E402
import theory  # noqa: E402
from harness.pictures import COLOURS  # noqa: E402
from tools import costs, fit, held, search  # noqa: E402

KINDS = ("forward", "backward", "weight")


class Row(NamedTuple):
    """One schedule's line: its tables replayed (simulation), or why it cannot run (error)."""
    schedule: str  # as --schedule takes it
    placement: str  # "loop" or "v"
    chunks: int  # model chunks a rank
    tables: list = None
    simulation: costs.Simulation = None
    error: str = None
    partition: list = None  # with --layers: each stage's blocks
    stage_costs: list = None  # with --layers: each stage's {kind: cost} at that split
    run_step: float = None  # with --costs-from: the step a run measures, its runtime and optimizer priced (fit.py)
    micro_batches: int = None  # m, the batch's micro-batches


def micro_batch_counts(text):
    """--micro-batches: one count, or several (1,2,4,8,16)."""
    return [int(count) for count in text.split(",")]


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1])
parser.error = lambda message: harness.fail(f"{message} (see --help)")  # argparse's own complaints in one line
harness.flags.declare(parser, "--stages", "--micro-batches", "--virtual-stages", changed={"--micro-batches": dict(
    type=micro_batch_counts, default=[8], metavar="M[,M...]", help="micro-batches each batch is split into, m; "
    "several (1,2,4,8,16): a row for each schedule at each, priced at its rows (--costs-from two traces or more), and "
    "the best of them within --batch-memory")})
cost_flags = parser.add_mutually_exclusive_group()
cost_flags.add_argument("--costs", default="1,1,1", help="a stage's F, I and W times (a full backward costs I + W), "
                        "and a message's between ranks: F,I,W[,MSG] (1,1,1)")
cost_flags.add_argument("--costs-from", metavar="TRACE", nargs="+",
                        help="F, I and W from the --trace of a run: each kind's mean span (with --layers, each "
                             "stage's own, fitted as a block's cost and the head's); from the traces of runs at two "
                             "micro-batch counts or more, a block's against a micro-batch's rows (tools/fit.py, "
                             "fit_rows; the head at its share of a block), priced at each --micro-batches' rows of "
                             "--batch-size")
parser.add_argument("--batch-size", type=int, help="the batch that --micro-batches split, in samples (default: the "
                    "traces')")
parser.add_argument("--batch-memory", type=float, metavar="F",
                    help="with several --micro-batches: the most activations a rank may hold, in batches of a stage "
                         "(the peak in micro-batches over m: the same at every m); the best row keeps within it")
parser.add_argument("--memory", type=float, help="the most activations a rank may hold, in micro-batches of a stage "
                    "(a chunk of a rank holding v is 1/v): rows over it are marked and the search keeps within it "
                    "(default: no mark, and the search holds at most what 1F1B does, n and what an I adds)")
parser.add_argument("--weight-memory", type=float, metavar="R",
                    help="the share of a micro-batch's activations that its I leaves held until its W (the "
                         "zero-bubble paper's M_W / M_B, R > 0; above 1, an I adds to what its F held): the peaks and "
                         "the search count it (default: this MLP's, 2L / (L + 1) at L = --layers / --stages blocks a "
                         "stage, 1 at least: tools/held.py's weight_share)")
parser.add_argument("--objective", choices=("step", "window"), default="step",
                    help="what the search shortens first: the step (one step to its flush) or the window (the "
                         "zero-bubble paper's, as steps run back to back see it); the other breaks ties (step)")
parser.add_argument("--placement", choices=("loop", "v"),
                    help="plan on this placement alone, the search's included (default: both)")
harness.flags.declare(parser, "--overlap", "--json", "--svg")
parser.add_argument("--save", metavar="FILE.csv", help="write the search's table, in PyTorch's compute_only CSV")
harness.flags.declare(parser, "--layers", "--hidden", "--classes", "--partition")
parser.set_defaults(layers=None)  # --costs, unless the model is given


def trace_spans(path):
    """A Chrome trace's complete events that have a duration, of the steps it measured where it says which (a
    harness trace's otherData: the first step pays for warm-up), and the trace itself (a dict, or {} for a list)."""
    try:
        with open(path) as file:
            trace = json.load(file)
    except (OSError, ValueError) as error:
        harness.fail(f"cannot read the trace {path}: {error}.")
    events, trace = (trace.get("traceEvents", []), trace) if isinstance(trace, dict) else (trace, {})
    measured = trace.get("otherData", {}).get("measured_steps")
    return [event for event in events if isinstance(event, dict) and event.get("ph") == "X"
            and isinstance(event.get("dur"), (int, float))
            and (measured is None or event.get("args", {}).get("step") in measured)], trace


def costs_from_trace(path):
    """A stage's F, I and W from a Chrome trace: each kind's mean span (dur, in microseconds), times the run's chunks
    a rank, since a chunk is that share of a stage."""
    spans, _ = trace_spans(path)
    num_chunks = 1 + max((int(event.get("args", {}).get("chunk") or 0) for event in spans), default=0)
    means = []
    for kind in KINDS:
        durations = [event["dur"] for event in spans if event.get("cat") == kind]
        if not durations:
            where = "a script that splits the backward (05, 06, 09)" if kind == "weight" else "a run"
            harness.fail(f"the trace {path} has no {kind} spans (ph 'X', cat '{kind}', a dur): pass the --trace of "
                         f"{where}.")
        means.append(num_chunks * sum(durations) / len(durations))
    return means


@costs.no_cycles
def plan(num_ranks, num_microbatches, num_chunks, cost, message, memory, placements=("loop", "v"), weight_memory=1,
         objective="step", overlap=1.0):
    """Every schedule's row on `placements`, and the search's on whichever of them is better by the objective
    (searched first: it checks memory)."""
    try:
        placement, chunks, tables = search.best_search(num_ranks, num_microbatches, cost, memory, message, num_chunks,
                                                       placements=placements, weight_memory=weight_memory,
                                                       objective=objective)
    except ValueError as error:
        harness.fail(str(error))

    def simulated(tables, placement, chunks):
        return costs.simulate(tables, placement, chunks, cost, message, weight_memory, overlap)

    searched = Row("search", placement, chunks, tables, simulated(tables, placement, chunks))
    rows = []
    for name, (_, placement) in schedules.SCHEDULES.items():
        if placement not in placements:
            continue
        chunks = num_chunks if schedules.takes_virtual_stages(name) else 2 if placement == "v" else 1
        try:
            tables = schedules.table(name, num_ranks, num_microbatches, chunks)
            rows.append(Row(name, placement, chunks, tables, simulated(tables, placement, chunks)))
        except ValueError as error:  # a layout the rule does not take, or a table that cannot run
            rows.append(Row(name, placement, chunks, error=str(error)))
    return rows + [searched]


def check_overlap(rows, overlap, cost):
    """--overlap no less than any row's F&B steps allow at the costs it was replayed at, or one sentence."""
    for row in rows:
        if row.tables is None:
            continue
        num_ranks = len(row.tables)

        def stage_of(rank, chunk):
            return theory.stage(row.placement, num_ranks, rank, chunk)

        stage_costs = cost if row.stage_costs is None else row.stage_costs
        least = theory.least_overlap(row.tables, stage_of, num_ranks * row.chunks, stage_costs)
        harness.flags.check_overlap(overlap, least, f"{row.schedule}'s F&B steps at these costs")


def split(args, num_stages):
    """--partition's blocks for num_stages stages (even, or the counts given), or ValueError with a sentence."""
    if args.partition == "even":
        if num_stages > args.layers:
            raise ValueError(f"{num_stages} stages cannot share --layers {args.layers}.")
        return common.partition(args.layers, num_stages)
    blocks = [int(count) for count in args.partition.split(",")]
    if len(blocks) != num_stages:
        raise ValueError(f"--partition {args.partition} gives {len(blocks)} stages, this layout has {num_stages}.")
    return blocks


def partitioned(row, args, costs_of):
    """A row at the stages' costs (costs_of: a split's blocks -> each stage's {kind: cost}): at --partition's split
    (unless it is balanced) and at the balanced split of its table, one row each (one if the two are the same)."""
    if row.error:
        return [row]
    num_ranks, num_stages = len(row.tables), len(row.tables) * row.chunks

    def stage_of(rank, chunk):
        return theory.stage(row.placement, num_ranks, rank, chunk)

    try:
        splits = [] if args.partition == "balanced" else [split(args, num_stages)]
    except ValueError as error:
        return [row._replace(error=str(error))]
    balanced = theory.balanced(args.layers, row.tables, stage_of, num_stages, args.hidden, args.classes,
                               costs_of=costs_of)
    rows = []
    for blocks in splits + [balanced] * (balanced not in splits):
        stage_costs = costs_of(blocks)
        rows.append(row._replace(partition=blocks, stage_costs=stage_costs, simulation=costs.simulate(
            row.tables, row.placement, row.chunks, stage_costs, weight_memory=args.weight_memory,
            overlap=args.overlap)))
    return rows


def priced(rows, args, cost, prices=None):
    """With --costs-from: each row with its run_step, at the trace's fitted prices (fit.py): each stage at its
    costs (--layers: the row's split's; else the trace's mean spans, a chunk its share), a full backward as the
    schedule's own script runs it (fit.as_run), and holding its blocks (else the trace's blocks shared out evenly);
    at `prices` where given (several traces'), else the trace's. The rows as they are if the trace has no step in
    parts (a trace of another program's)."""
    _, trace = trace_spans(args.costs_from[0])
    blocks = trace.get("otherData", {}).get("blocks") or [1]
    try:
        prices = prices or fit.fit(trace)
    except ValueError:
        return rows
    rows_priced = []
    for row in rows:
        if row.tables is None:
            rows_priced.append(row)
            continue
        num_stages = len(row.tables) * row.chunks
        if row.partition is None:
            stage_costs = [{kind: value / row.chunks for kind, value in cost.items()}] * num_stages
            stage_blocks = [sum(blocks) / num_stages] * num_stages
        else:
            stage_costs, stage_blocks = row.stage_costs, row.partition
        stage_costs = [fit.as_run(cost, row.schedule) for cost in stage_costs]
        rows_priced.append(row._replace(run_step=fit.run_step(row.tables, row.placement, row.chunks, stage_costs,
                                                              prices, stage_blocks)))
    return rows_priced


def fitted_costs(path):
    """With --layers and --costs-from: each stage's own measured F, I and W in the trace (its mean span on that
    stage, in microseconds), fitted as a block's cost times the stage's blocks plus, on the last stage, the head's:
    a function from a split's blocks to each stage's costs, as theory.counted_costs gives them."""
    spans, trace = trace_spans(path)
    blocks = trace.get("otherData", {}).get("blocks")
    if not blocks or len(blocks) < 2 or not any(blocks[:-1]):
        harness.fail(f"the trace {path} does not give each stage's blocks for two stages or more (otherData): pass "
                     "the --trace of a run on 2 ranks or more, whose spans carry their stage.")
    fitted = {}
    for kind in KINDS:
        means = []
        for stage in range(len(blocks)):
            durations = [event["dur"] for event in spans if event.get("cat") == kind
                         and event.get("args", {}).get("stage") == stage]
            if not durations:
                harness.fail(f"the trace {path} has no {kind} spans on stage {stage}: pass the --trace of a script "
                             "that splits the backward (05, 06, 09), run on this version.")
            means.append(sum(durations) / len(durations))
        block = sum(mean / count for mean, count in zip(means[:-1], blocks) if count) / sum(map(bool, blocks[:-1]))
        # a block's, the head's: none less than nothing, as noise can make a small head seem
        fitted[kind] = block, max(0.0, means[-1] - block * blocks[-1])

    def costs_of(split):
        costs = []
        for stage, count in enumerate(split):
            cost = {kind: block * count + head * (stage == len(split) - 1) for kind, (block, head) in fitted.items()}
            costs.append({**cost, "full_backward": cost["backward"] + cost["weight"],
                          "overlapped_backward": cost["backward"] + cost["weight"]})
        return costs

    return costs_of


def counted(args):
    """theory.counted_costs for this model: a function from a split's blocks to each stage's costs."""
    def costs_of(blocks):
        return theory.counted_costs(blocks, args.hidden, args.classes)

    return costs_of


def model_costs(args, costs_of):
    """The mean stage's costs (the search's): the whole model's, shared by --stages. Checks the model flags."""
    for flag in ("layers", "hidden", "classes"):
        if getattr(args, flag) < 1:
            harness.fail(f"--{flag} is {getattr(args, flag)}: pass 1 or more.")
    if args.partition not in ("even", "balanced") and not all(count.strip().isdigit()
                                                               for count in args.partition.split(",")):
        harness.fail(f"--partition takes even, balanced, or each stage's blocks as whole numbers N0,N1,..., "
                     f"not {args.partition}.")
    whole = costs_of([args.layers])[0]
    return {kind: cost / args.stages for kind, cost in whole.items()}


def over_memory(simulation, memory):
    """Whether the rank that holds most holds more than --memory (None: no --memory given)."""
    return None if memory is None else max(simulation.peak_inflight) > memory + 1e-9


def to_csv(tables, placement):
    """The tables as PyTorch's compute_only CSV (schedules.from_csv reads it back): a row per rank, a cell per
    action, stage index, letter and micro-batch; a forward and the overlapped backward after it one cell."""
    rows = []
    for rank, order in enumerate(tables):
        cells = []
        for kind, chunk, micro_batch in order:
            cell = f"{theory.stage(placement, len(tables), rank, chunk)}{schedules.LETTERS[kind]}{micro_batch}"
            if kind == "overlapped_backward":  # one step with the forward before it
                cell = f"({cells.pop()};{cell})OVERLAP_F_B"
            cells.append(cell)
        rows.append(",".join(cells))
    return "\n".join(rows) + "\n"


def write_svg(path, row, cost):
    """A line per rank, a box per computation from its start for its cost, coloured by kind; idle left blank."""
    left, width, height = 60, 960, 22
    scale = width / row.simulation.step
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 10}" '
             f'height="{height * (len(row.tables) + 1)}" font-family="monospace" font-size="11">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="4" y="15">{row.schedule} ({row.placement}, {row.chunks} chunk(s) a rank): '
             f'step {row.simulation.step:g}, bubble {row.simulation.bubble:.3f}</text>']
    for rank, table in enumerate(row.tables):
        y = height * (rank + 1)
        parts.append(f'<text x="4" y="{y + 15}">rank {rank}</text>')
        for kind, chunk, micro_batch in table:
            stage = theory.stage(row.placement, len(row.tables), rank, chunk)
            start, _ = row.simulation.spans[kind, stage, micro_batch]
            length = cost[stage][kind] if isinstance(cost, list) else cost[kind] / row.chunks
            x, w = left + start * scale, length * scale
            parts.append(f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{height - 4}" '
                         f'fill="{COLOURS.get(kind, COLOURS["backward"])}" stroke="white"/>')
    with open(path, "w") as file:
        file.write("\n".join(parts + ["</svg>"]) + "\n")


def default_weight_memory(layers, num_stages):
    """--weight-memory's default: this MLP's own share (tools/held.py's weight_share) at the mean stage's blocks, one
    at least (a stage holds a block)."""
    return held.weight_share(max(1, layers / num_stages))


def default_memory(num_stages, weight_memory):
    """--memory's default: what 1F1B holds, n micro-batches and what an I adds to them at this share."""
    return num_stages + max(0, weight_memory - 1)


@costs.no_cycles
def main():
    args = parser.parse_args()
    counts = args.micro_batches
    for flag, value in (("--stages", args.stages), ("--micro-batches", min(counts)),
                        ("--virtual-stages", args.virtual_stages)):
        if value < 1:
            harness.fail(f"{flag} is {value}: pass 1 or more.")
    for flag, path in (("--save", args.save), ("--svg", args.svg)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            harness.fail(f"{flag} {path}: its folder does not exist.")
    traces = [trace_spans(path)[1] for path in args.costs_from or []]
    if len(counts) > 1 and len(traces) < 2:
        harness.fail("several --micro-batches need --costs-from two traces or more, of runs at different micro-batch "
                     "counts: a micro-batch's cost against its rows.")
    fitted = None  # with several traces: each kind's costs and the prices against a micro-batch's rows (RowCosts)
    if len(traces) > 1:
        try:
            fitted = fit.fit_rows(traces)
        except ValueError as error:
            harness.fail(f"--costs-from: {error}")
        args.layers = sum(traces[0]["otherData"]["blocks"]) if args.layers is None else args.layers
        args.batch_size = args.batch_size or traces[0]["otherData"].get("batch_size")
        if not args.batch_size or any(count > args.batch_size for count in counts):
            harness.fail(f"--micro-batches {','.join(map(str, counts))} must each be at most --batch-size "
                         f"({args.batch_size}): pass the batch size (the traces' lack it) or fewer micro-batches.")
    if args.weight_memory is None:
        layers = harness.flags.FLAGS["--layers"]["default"] if args.layers is None else args.layers
        args.weight_memory = default_weight_memory(layers, args.stages)
    if not 0 < args.weight_memory < math.inf:
        harness.fail(f"--weight-memory is {args.weight_memory:g}: pass the share of a micro-batch's activations that "
                     "its I leaves held until its W, a number above 0.")
    harness.flags.check_overlap(args.overlap)
    memory = default_memory(args.stages, args.weight_memory) if args.memory is None else args.memory
    rows = []
    for count in counts:
        count_rows, cost, message = plan_count(args, count, memory, fitted)
        rows += count_rows
    searched = rows[-1]  # the search's (with --layers, at its balanced split), at the last count
    if args.save:
        with open(args.save, "w") as file:
            file.write(to_csv(searched.tables, searched.placement))
    if args.svg:
        write_svg(args.svg, searched, cost if searched.stage_costs is None else searched.stage_costs)
    model = describe(args, cost, message, fitted)
    print_rows(args, rows, counts, f"{model}; the search within memory {memory:g}, an I leaving "
               f"{args.weight_memory:.4g} of its micro-batch for its W", searched)


def plan_count(args, count, memory, fitted):
    """The rows at `count` micro-batches: each schedule's and the search's (last), priced where traces give prices
    (fitted: several traces' RowCosts); and the mean stage's costs and the message's the search ran at."""
    prices = None
    if fitted is not None:  # a micro-batch of B / m rows
        rows_a_micro_batch = args.batch_size / count

        def costs_of(split):
            return fitted.stage_costs(split, rows_a_micro_batch)

        prices = fitted.prices_at(rows_a_micro_batch)
        cost, message = model_costs(args, costs_of), 0.0
    elif args.costs_from and args.layers is None:
        cost, message = costs.stage_costs(*costs_from_trace(args.costs_from[0])), 0.0
    elif args.layers is None:
        try:
            cost, message = costs.parse_costs(args.costs)
        except ValueError as error:
            harness.fail(str(error))
    else:  # each stage's costs: measured in a trace and fitted, or counted
        costs_of = fitted_costs(args.costs_from[0]) if args.costs_from else counted(args)
        cost, message = model_costs(args, costs_of), 0.0
    placements = (args.placement,) if args.placement else ("loop", "v")
    rows = plan(args.stages, count, args.virtual_stages, cost, message, memory, placements, args.weight_memory,
                args.objective, args.overlap)
    if args.layers is not None:
        rows = [split_row for row in rows for split_row in partitioned(row, args, costs_of)]
    check_overlap(rows, args.overlap, cost)
    if args.costs_from:
        rows = priced(rows, args, cost, prices)
    return [row._replace(micro_batches=count) for row in rows], cost, message


def describe(args, cost, message, fitted):
    """The costs the rows were replayed at, in words."""
    forward, input_grad, weight = (cost[kind] for kind in KINDS)
    if fitted is not None:
        return (f"{args.layers} blocks, a batch of {args.batch_size}: each stage's F, I and W fitted against its rows "
                f"({len(args.costs_from)} traces)")
    if args.layers is not None:
        return (f"--layers {args.layers}, --hidden {args.hidden}, --classes {args.classes}: each stage's counted costs "
                f"(the mean stage's F {forward:.4g}, I {input_grad:.4g}, W {weight:.4g} block forwards)")
    return f"a stage's F {forward:g}, I {input_grad:g}, W {weight:g}, message {message:g}"


def within_batch_memory(row, args):
    """Whether a row's busiest rank holds at most --batch-memory batches of a stage (True without the flag)."""
    held = max(row.simulation.peak_inflight) / row.micro_batches  # in batches of a stage
    return args.batch_memory is None or held <= args.batch_memory + 1e-9


def print_rows(args, rows, counts, header, searched):
    """Print the rows, the fastest first (a table under the header, or --json a line each); with several counts, the
    best row within --batch-memory, else the search's recommendation."""

    def order(row):
        """A row's place: by the step a run measures where priced, else by the replay's; rows that cannot run last."""
        if row.simulation is None:
            return math.inf
        return row.simulation.step if row.run_step is None else row.run_step

    rows.sort(key=order)
    several = len(counts) > 1
    best = next((row for row in rows if row.simulation is not None and within_batch_memory(row, args)), None)
    if args.json:
        for row in rows:
            fields = {"error": row.error} if row.error else {
                "step": row.simulation.step, "bubble": row.simulation.bubble,
                "bubble_window": row.simulation.bubble_window, "window_idle": row.simulation.window_idle,
                "peak_inflight": row.simulation.peak_inflight, "weight_memory": args.weight_memory,
                "messages": row.simulation.messages,
                "over_memory": over_memory(row.simulation, args.memory)}
            if row.run_step is not None:
                fields["run_step"] = row.run_step
            if row.partition is not None:
                fields.update(partition=row.partition, stage_costs=[
                    {kind: cost[kind] for kind in KINDS}
                    for cost in row.stage_costs])
            if several and not row.error:
                fields.update(batch_memory=max(row.simulation.peak_inflight) / row.micro_batches, best=row is best)
            print(json.dumps({"schedule": row.schedule, "placement": row.placement, "chunks": row.chunks,
                              "micro_batches": row.micro_batches, **fields}))
        return
    print(f"n = {args.stages} ranks, m = {','.join(map(str, counts))} micro-batches; {header}")
    priced_too = any(row.run_step is not None for row in rows)  # a column of each row's run_step
    print(f"{'schedule':<24} {'placement':>9} {'chunks':>6}" + f" {'m':>4}" * several + f" {'step':>10}" +
          f" {'run':>10}" * priced_too + f" {'bubble':>7} {'window':>7} {'peak':>6} {'rank 0':>6} {'messages':>8}" +
          "  partition" * (args.layers is not None))
    for row in rows:
        start = f"{row.schedule:<24} {row.placement:>9} {row.chunks:>6}" + f" {row.micro_batches:>4}" * several
        if row.error:
            print(f"{start}  does not run: {row.error}")
            continue
        simulation = row.simulation
        mark = "  over --memory" if over_memory(simulation, args.memory) else ""
        mark += "  over --batch-memory" if several and not within_batch_memory(row, args) else ""
        blocks = "" if row.partition is None else "  " + ",".join(map(str, row.partition))
        run = f" {row.run_step:>10.1f}" if priced_too else ""
        print(f"{start} {simulation.step:>10.1f}{run} {simulation.bubble:>7.3f} {simulation.bubble_window:>7.3f} "
              f"{max(simulation.peak_inflight):>6g} "
              f"{simulation.peak_inflight[0]:>6g} {max(simulation.messages):>8}{blocks}{mark}")
    if several:
        print("best: " + (f"{best.schedule} ({best.placement}, {best.chunks} chunk(s) a rank) at m = "
                          f"{best.micro_batches}" if best else "no row within --batch-memory"))
        return
    saved = f"; its table is in {args.save}: run it with 09_any_schedule.py --schedule {args.save}" * bool(args.save)
    print(f"recommended: search ({searched.placement}, {searched.chunks} chunk(s) a rank){saved}")


if __name__ == "__main__":
    main()
