"""A table drawn as text, a row per rank and time left to right, each computation where its replay starts it: the one
source of every schedule picture in the scripts' docstrings, the README and docs/ (tests/test_pictures.py holds
each to it). PyTorch's letters: F forward, I a split backward's input gradient, W its weight gradient, B a full
backward; a rank's second chunk of two in small letters (f, i, w, b), and with more chunks .c after the micro-batch;
[F3 b1] an overlapped F&B step, one step from its first input to its last result.

    python tools/draw.py --schedule 1f1b --stages 4 --micro-batches 8
    python tools/draw.py --schedule dualpipev --stages 2 --micro-batches 5 --full-backward-units 2
"""

import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the lesson's modules
import harness  # noqa: E402
import schedules  # noqa: E402
import theory  # noqa: E402


def draw(tables, placement="loop", cost=theory.UNIT_SPANS, labels=None, then=""):
    """The tables' picture: each computation at its start in a replay at cost[kind] (every span one unit unless
    given), `labels` the rows' names ("rank r" unless given) and `then` written after each row's last computation."""
    num_ranks, num_chunks = len(tables), 1 + max(chunk for table in tables for _, chunk, _ in table)

    def stage_of(rank, chunk):
        return theory.stage(placement, num_ranks, rank, chunk)

    def cell(kind, chunk, micro_batch):
        letter = schedules.LETTERS[kind]  # an overlapped backward is a full one
        letter = letter.lower() if num_chunks == 2 and chunk == 1 else letter
        return f"{letter}{micro_batch}" + (f".{chunk}" if num_chunks > 2 else "")

    spans = theory.replay(tables, stage_of, num_ranks * num_chunks, cost)
    steps = []  # each rank's (start, text, units): a computation, or an overlapped pair in brackets
    for rank, table in enumerate(tables):
        steps.append([])
        for kind, chunk, micro_batch in table:
            if kind == "overlapped_backward":  # one step with the forward before it
                start, text, units = steps[rank].pop()
                steps[rank].append((start, f"[{text} {cell(kind, chunk, micro_batch)}]", units + cost[kind]))
            else:
                start = spans[kind, stage_of(rank, chunk), micro_batch][0]
                steps[rank].append((start, cell(kind, chunk, micro_batch), cost[kind]))
    # characters a unit: room for each step's text and a space after it (a bracket sits in the space before)
    unit = max(math.ceil((len(text) + 1 - text.startswith("[")) / units) for row in steps for _, text, units in row)
    labels = labels or [f"rank {rank}" for rank in range(num_ranks)]
    margin = 2 + max(len(label) for label in labels)
    rows = []
    for rank, row_steps in enumerate(steps):
        row = labels[rank].ljust(margin)
        for start, text, _ in row_steps:
            row = row.ljust(margin + round(start * unit) - text.startswith("[")) + text
        rows.append(f"{row} {then}".rstrip())
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.error = lambda message: harness.fail(f"{message} (see --help)")
    harness.flags.declare(parser, "--schedule", "--stages", "--micro-batches", "--virtual-stages",
                            schedules=", ".join(schedules.SCHEDULES))
    parser.set_defaults(virtual_stages=None)
    parser.add_argument("--full-backward-units", type=float, default=1.0, metavar="U",
                        help="the units a full backward lasts: 1, as --pace makes it (default), or 2, its I and W")
    args = parser.parse_args()
    try:
        found = schedules.load(args.schedule, args.stages, args.micro_batches, args.virtual_stages)
    except ValueError as error:
        harness.fail(f"--schedule {args.schedule} on {args.stages} ranks: {error}")
    cost = {**theory.UNIT_SPANS, "full_backward": args.full_backward_units,
            "overlapped_backward": args.full_backward_units}
    print(draw(found.tables, found.placement, cost))


if __name__ == "__main__":
    main()
