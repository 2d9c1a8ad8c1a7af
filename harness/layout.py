"""The lab's part of the pipeline's layout: the flags, checked against it (add_flags: 09's table too), and once
common.setup knows it, each stage's blocks as --partition says, and --pace's spans by each stage's counted cost."""

import schedules
import theory
from harness import flags
from harness.meters import pace_at
from harness.startup import before_setup


def add_flags(parser):
    """common.parse_args's parser, before it parses: the harness's flags and what each flag means (flags.add_flags);
    once parsed, each mistake one sentence (flags.check_args, 09's table against the layout too), then this rank's
    cores and threads (startup.before_setup)."""
    taken = flags.add_flags(parser, schedules)  # the lesson's flags this script takes
    parse = parser.parse_args
    parser.parse_args = lambda: before_setup(flags.check_args(parse(), schedules, taken))


def plan_stages(args, rank, num_ranks, stage_of):
    """Once the pipeline is known (common.setup, which shares the blocks out evenly in args.blocks): each stage's
    count of blocks as --partition says, if not even (the counts given, or balanced: the split whose replay of this
    script's table at the stages' counted costs takes the least step, theory.balanced), and --pace's span of each of
    this rank's chunks, its stage's counted cost over the mean stage's (pace_at)."""
    num_stages = num_ranks * args.virtual_stages
    if args.partition == "balanced":  # 01 takes no --schedule: its one micro-batch runs GPipe's table at m = 1
        table = schedules.load(getattr(args, "schedule", "gpipe"), num_ranks, args.micro_batches,
                               args.virtual_stages).tables
        args.blocks = theory.balanced(args.layers, table, stage_of, num_stages, args.hidden, args.classes)
    elif args.partition != "even":
        args.blocks = [int(count) for count in args.partition.split(",")]
    costs = theory.counted_costs(args.blocks, args.hidden, args.classes)
    pace_at(costs, [stage_of(rank, chunk) for chunk in range(args.virtual_stages)])
