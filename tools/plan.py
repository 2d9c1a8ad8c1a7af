"""Plan a pipeline on paper: every schedule in schedules.py, and one searched for your costs and memory, replayed at
a stage's costs, one row each, the fastest first. No processes: each row is a replay (tools/costs.py).

    python tools/plan.py --stages 8 --micro-batches 32 --costs 1,2,1
    python tools/plan.py --stages 8 --micro-batches 32 --costs-from /tmp/trace.json --memory 8 --json
    python tools/plan.py --stages 4 --micro-batches 8 --costs 1,2,1 --save plan.csv --svg plan.svg
    torchrun --nproc_per_node=4 09_any_schedule.py --schedule plan.csv --micro-batches 8

step: the pipeline's span, first start to last end, in cost units. bubble: the busiest rank's idle share of it, as a
script's bubble_theory. peak: activations alive at once, in micro-batches of a stage (a chunk of a rank holding v
chunks is 1/v of a stage), on the rank that holds most and on rank 0. messages: the tensors a rank sends to another
rank in a step, the most of any rank. search: tools/search.py on whichever placement is faster: the loop at one
chunk a rank or at --virtual-stages, or the V. It is the row plan.py recommends (never slower than a row that fits
--memory): --save writes its table as PyTorch's compute_only CSV, which 09 and PyTorch's runtime run.
"""

import argparse
import json
import math
import os
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the lesson's modules, and tools as a package
import harness  # noqa: E402
import schedules  # noqa: E402
import theory  # noqa: E402
from harness.pictures import COLOURS  # noqa: E402
from tools import costs, search  # noqa: E402

KINDS = ("forward", "backward", "weight")


class Row(NamedTuple):
    """One schedule's line: its tables replayed (simulation), or why it cannot run (error)."""
    schedule: str  # as --schedule takes it
    placement: str  # "loop" or "v"
    chunks: int  # model chunks a rank
    tables: list = None
    simulation: costs.Simulation = None
    error: str = None


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1])
parser.error = lambda message: harness.fail(f"{message} (see --help)")  # argparse's own complaints in one line
harness.flags.add_flags(parser, "--stages", "--micro-batches", "--virtual-stages")
cost_flags = parser.add_mutually_exclusive_group()
cost_flags.add_argument("--costs", default="1,1,1", help="a stage's F, B and W times, and a message's between ranks: "
                        "F,B,W[,MSG] (1,1,1)")
cost_flags.add_argument("--costs-from", metavar="TRACE",
                        help="F, B and W from the --trace of a run: each kind's mean span")
parser.add_argument("--memory", type=float, help="the most activations a rank may hold, in micro-batches of a stage "
                    "(a chunk of a rank holding v is 1/v): rows over it are marked and the search keeps within it "
                    "(default: no mark, and the search holds at most n, as 1F1B)")
harness.flags.add_flags(parser, "--json", "--svg")
parser.add_argument("--save", metavar="FILE.csv", help="write the search's table, in PyTorch's compute_only CSV")


def costs_from_trace(path):
    """A stage's F, B and W from a Chrome trace: each kind's mean span (dur, in microseconds), times the run's chunks
    a rank, since a chunk is that share of a stage."""
    try:
        with open(path) as file:
            trace = json.load(file)
    except (OSError, ValueError) as error:
        harness.fail(f"cannot read the trace {path}: {error}.")
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    spans = [event for event in events if isinstance(event, dict) and event.get("ph") == "X"
             and isinstance(event.get("dur"), (int, float))]
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


def plan(num_ranks, num_microbatches, num_chunks, cost, message, memory):
    """Every schedule's row, and the search's on whichever placement is faster (searched first: it checks memory)."""
    try:
        placement, chunks, tables = search.best_search(num_ranks, num_microbatches, cost, memory, message, num_chunks)
    except ValueError as error:
        harness.fail(str(error))
    searched = Row("search", placement, chunks, tables, costs.simulate(tables, placement, chunks, cost, message))
    rows = []
    for name, (_, placement) in schedules.SCHEDULES.items():
        chunks = num_chunks if schedules.takes_virtual_stages(name) else 2 if placement == "v" else 1
        try:
            tables = schedules.table(name, num_ranks, num_microbatches, chunks)
            rows.append(Row(name, placement, chunks, tables, costs.simulate(tables, placement, chunks, cost, message)))
        except ValueError as error:  # a layout the rule does not take, or a table that cannot run
            rows.append(Row(name, placement, chunks, error=str(error)))
    return rows + [searched]


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
            x, w = left + start * scale, cost[kind] / row.chunks * scale
            parts.append(f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{height - 4}" '
                         f'fill="{COLOURS.get(kind, COLOURS["backward"])}" stroke="white"/>')
    with open(path, "w") as file:
        file.write("\n".join(parts + ["</svg>"]) + "\n")


def main():
    args = parser.parse_args()
    for flag, value in (("--stages", args.stages), ("--micro-batches", args.micro_batches),
                        ("--virtual-stages", args.virtual_stages)):
        if value < 1:
            harness.fail(f"{flag} is {value}: pass 1 or more.")
    for flag, path in (("--save", args.save), ("--svg", args.svg)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            harness.fail(f"{flag} {path}: its folder does not exist.")
    if args.costs_from:
        cost, message = costs.stage_costs(*costs_from_trace(args.costs_from)), 0.0
    else:
        try:
            cost, message = costs.parse_costs(args.costs)
        except ValueError as error:
            harness.fail(str(error))
    forward, backward, weight = (cost[kind] for kind in KINDS)
    memory = args.stages if args.memory is None else args.memory
    rows = plan(args.stages, args.micro_batches, args.virtual_stages, cost, message, memory)
    searched = rows[-1]
    if args.save:
        with open(args.save, "w") as file:
            file.write(to_csv(searched.tables, searched.placement))
    if args.svg:
        write_svg(args.svg, searched, cost)
    rows.sort(key=lambda row: row.simulation.step if row.simulation else math.inf)
    if args.json:
        for row in rows:
            fields = {"error": row.error} if row.error else {
                "step": row.simulation.step, "bubble": row.simulation.bubble,
                "peak_inflight": row.simulation.peak_inflight, "messages": row.simulation.messages,
                "over_memory": over_memory(row.simulation, args.memory)}
            print(json.dumps({"schedule": row.schedule, "placement": row.placement, "chunks": row.chunks, **fields}))
        return
    print(f"n = {args.stages} ranks, m = {args.micro_batches} micro-batches; a stage's F {forward:g}, B {backward:g}, "
          f"W {weight:g}, message {message:g}; the search within memory {memory:g}")
    print(f"{'schedule':<24} {'placement':>9} {'chunks':>6} {'step':>10} {'bubble':>7} {'peak':>6} {'rank 0':>6} "
          f"{'messages':>8}")
    for row in rows:
        start = f"{row.schedule:<24} {row.placement:>9} {row.chunks:>6}"
        if row.error:
            print(f"{start}  does not run: {row.error}")
            continue
        simulation = row.simulation
        mark = "  over --memory" if over_memory(simulation, args.memory) else ""
        print(f"{start} {simulation.step:>10.1f} {simulation.bubble:>7.3f} {max(simulation.peak_inflight):>6g} "
              f"{simulation.peak_inflight[0]:>6g} {max(simulation.messages):>8}{mark}")
    saved = f"; its table is in {args.save}: run it with 09_any_schedule.py --schedule {args.save}" * bool(args.save)
    print(f"recommended: search ({searched.placement}, {searched.chunks} chunk(s) a rank){saved}")


if __name__ == "__main__":
    main()
