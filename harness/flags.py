"""The flags every script takes, their checks, and ending a run with one sentence."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import theory


class PipelineError(Exception):
    """A failure explained in one sentence: printed as such, without a traceback."""


def gave_up(doing, waiting_for, error, who):
    """A wait that failed, as the one sentence every wait says: what this rank was doing, whom it waited for,
    and `who` of them may be to blame."""
    return PipelineError(f"rank {dist.get_rank()} gave up in {doing} waiting for {waiting_for} "
                         f"({str(error).splitlines()[0]}); {who} may be stuck, dead or itself waiting, "
                         "or just slower than --timeout")


def fail(message):
    """End the run with one sentence and a non-zero exit. Every rank finds the same mistake, and one rank
    per node says it; the others wait for torchrun to stop them (exiting first could get the speaking rank
    stopped before it speaks)."""
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    else:
        time.sleep(10)
    os._exit(2)  # skip interpreter teardown: nothing to save, and no rank waits on us


CORES_PER_RANK = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))  # on this host
# The flags more than one program takes (the scripts, tools/plan.py, tools/torch_schedules.py), each declared here
# once: its add_argument keywords. A help may name {schedules}, which the program fills in.
FLAGS = {
    "--layers": dict(type=int, default=16, help="hidden blocks (Linear + ReLU) before the head (tools/plan.py: given, "
                                                "it plans at the stages' counted costs, not --costs)"),
    "--hidden": dict(type=int, default=1024, help="width of every block"),
    "--classes": dict(type=int, default=10, metavar="K",
                      help="the head's outputs and the data's classes (the head is a hidden x K matrix)"),
    "--partition": dict(default="even", metavar="even|N0,N1,...|balanced",
                        help="each stage's blocks: shared out by count (the leftover to the first stages), given in "
                             "stage order (the last also holds the head, and may hold no block), or the split whose "
                             "replayed step at the stages' counted costs is least"),
    "--stages": dict(type=int, required=True, metavar="N", help="ranks in the pipeline on paper, n"),
    "--micro-batches": dict(type=int, default=8, help="micro-batches each batch is split into, m"),
    "--virtual-stages": dict(type=int, default=2, metavar="V",
                             help="model chunks per rank (04: 2 or more); for a schedule, where it takes a count "
                                  "(the interleaved and looped ones), else the table's own (the V's 2, others 1)"),
    "--schedule": dict(default="1f1b", metavar="NAME|FILE.csv",
                       help="the table to run: one of {schedules}, or a file in PyTorch's compute_only CSV "
                            "(tools/plan.py --save writes one)"),
    "--overlap": dict(type=float, default=1.0, metavar="R",
                      help="an overlapped F&B step (DualPipeV's) lasts R of its forward and its full backward one "
                           "after the other: 1, no overlap, down to the longer part's share, each hidden in the other "
                           "(09: with --pace, each part paced at R of its span)"),
    "--threads": dict(type=int, default=CORES_PER_RANK,
                      help="torch threads per rank (default: cores / ranks on this host)"),
    "--json": dict(action="store_true", help="print the results as JSON, an object a line (plan.py: not its table)"),
    "--svg": dict(metavar="FILE", help="draw the timeline as a picture (SVG): a run's last step, a plan's table"),
    "--dump-grads": dict(metavar="DIR", help="write each rank's gradients after the first backward, DIR/rank{{R}}.pt: "
                                             "parameter name to gradient"),
}


def declare(parser, *flags, changed=None, **help_fields):
    """Add these flags of FLAGS to parser; help_fields fill in the names their help mentions. changed: flag -> the
    keywords a program takes it with instead of FLAGS' (plan.py's --micro-batches: several counts)."""
    for flag in flags:
        keywords = dict(FLAGS[flag]) | (changed or {}).get(flag, {})
        keywords["help"] = keywords["help"].format(**help_fields)
        parser.add_argument(flag, **keywords)


# What the lesson's other flags mean (common.FLAGS; those above say it there)
HELPS = {
    "--batch-size": "samples per optimizer step",
    "--steps": "optimizer steps",
    "--lr": "Adam learning rate (1e-4: the default MLP's loss falls from the first step; at 5e-4 Adam's first steps "
            "overshoot and it jumps before it falls)",
    "--seed": "seeds the weights and the data",
    "--dtype": "the parameters' and activations' type (float64: the tests' exact comparisons)",
    "--timeout": "seconds a rank waits on another, then gives up",
    "--recompute": "keep only each stage's input from F to B; B reruns F",
    "--data-parallel": "pipelines side by side, world / D stages each, their gradients summed",
    "--tensor-parallel": "shards a stage, cut by width",
}
METAVARS = {"--data-parallel": "D", "--tensor-parallel": "T"}
CHOICES = {"--dtype": ("float32", "float64")}


def add_flags(parser, schedules):
    """The harness's part of a script's parser (common.parse_args, through startup.add_flags), before it parses: what
    each of the lesson's flags means, the harness's own flags, and argparse's complaints as one sentence. schedules:
    the module whose tables 09's --schedule names. Returns the lesson's flags it found, by their dest (check_args)."""
    parser.description = parser.description.split("\n\n")[0]
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.error = lambda message: fail(f"{message} (see --help)")
    taken = set()
    for action in parser._actions[1:]:  # the lesson's, after -h
        flag = action.option_strings[0]
        taken.add(action.dest)
        keywords = FLAGS.get(flag, dict(help=HELPS.get(flag), metavar=METAVARS.get(flag)))
        action.help = keywords["help"].format(schedules=", ".join(schedules.SCHEDULES))
        action.metavar, action.choices = keywords.get("metavar", action.metavar), CHOICES.get(flag)
    declare(parser, "--threads")
    one_process = bool(parser.get_default("one_process"))  # 00's value: the whole model in one process
    parser.set_defaults(sync_sends=False, partition="even", one_process=one_process)
    if not one_process:
        declare(parser, "--partition")
        parser.add_argument("--sync-sends", action="store_true",
                            help="NCCL's rules on gloo: a rank's groups run in turn, each done once its sends are "
                                 "received, and tags are ignored")
    if "schedule" in taken:  # 09
        declare(parser, "--overlap")
    parser.add_argument("--pace", type=float, default=0.0, metavar="MS",
                        help="pad every forward, backward and weight-gradient span by sleeping, to MS milliseconds "
                             "times its stage's counted cost over the mean stage's, so the timeline shows the "
                             "schedule alone")
    declare(parser, "--json")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace (Perfetto, chrome://tracing) of the run")
    declare(parser, "--svg")
    declare(parser, "--dump-grads")
    parser.add_argument("--dump-params", metavar="DIR", help="write each rank's parameters after the last step (08: "
                        "shard 0 of a stage its whole tensors, the other shards empty files)")
    parser.add_argument("--no-instrument", action="store_true", help="skip the timing and memory hooks (their cost)")
    parser.add_argument("--overhead", action="store_true",
                        help="instrument the even steps only, and compare their time with the odd steps'")
    return taken


def check_args(args, schedules, taken):
    """Each mistake in the flags, or in how the run was started, ends it with one sentence (common.parse_args, once
    parsed); returns the flags. taken: the lesson's flags the script takes (add_flags). 09 (--schedule): the table
    must suit the layout (schedules.load); sets args.placement and its chunks."""
    if "schedule" in taken:
        _check_schedule(args, schedules)
    _check(args, args.one_process, "virtual_stages" in taken and "schedule" not in taken)
    return args


def model_flags(doc, defaults, names):
    """The lesson's flags `names`, at their `defaults` (common.FLAGS), with their helps, and --threads:
    tools/torch_schedules.py's, which runs PyTorch's runtime on the lesson's model."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.error = lambda message: fail(f"{message} (see --help)")  # one sentence, not argparse's usage
    parser.set_defaults(micro_batches=1, virtual_stages=1, data_parallel=1, tensor_parallel=1, sync_sends=False,
                        partition="even")
    for name in names:
        flag, default = "--" + name.replace("_", "-"), defaults[name]
        if flag in FLAGS:
            declare(parser, flag)
        elif default is False:
            parser.add_argument(flag, action="store_true", help=HELPS[flag])
        else:
            parser.add_argument(flag, type=type(default), default=default, help=HELPS[flag], choices=CHOICES.get(flag))
    declare(parser, "--threads")
    return parser


def _check_schedule(args, schedules):
    """09: a table the layout can run, by name or from a file (schedules.load). Sets args.placement and
    args.virtual_stages, the model chunks a rank holds."""
    num_ranks = int(os.environ.get("WORLD_SIZE", 1))
    for flag, value in (("--micro-batches", args.micro_batches), ("--virtual-stages", args.virtual_stages)):
        if value is not None and value < 1:  # before the table is made for them
            fail(f"{flag} must be at least 1, not {value}.")
    try:
        found = schedules.load(args.schedule, num_ranks, args.micro_batches, args.virtual_stages)
    except ValueError as error:
        fail(f"--schedule {args.schedule} on {num_ranks} rank{'s' * (num_ranks > 1)}: {error}")
    args.placement, args.virtual_stages = found.placement, found.num_chunks

    def stage_of(rank, chunk):
        return theory.stage(found.placement, num_ranks, rank, chunk)

    # each part of an F&B step is paced at --overlap of its span: at stages of equal cost, a forward one, a full
    # backward two
    least = theory.least_overlap(found.tables, stage_of, num_ranks * found.num_chunks, theory.UNIT_COSTS)
    check_overlap(args.overlap, least, "this table's F&B steps at --pace's spans")


def check_overlap(overlap, least=0.0, steps="its F&B steps"):
    """--overlap above 0, at most 1 (no overlap), and no less than `least` (theory.least_overlap of `steps`), or
    one sentence (09, tools/plan.py)."""
    if not 0 < overlap <= 1:
        fail(f"--overlap is {overlap:g}: an F&B step lasts a share of its two parts one after the other, above 0 and "
             "at most 1 (no overlap).")
    if overlap < least - 1e-12:
        fail(f"--overlap {overlap:g} is below {least:.4g}, the least of {steps}: a step lasts its longer part at "
             "least, the other hidden in it; pass that or more (1: no overlap).")


def _check_partition(args, num_stages):
    """--partition N0,N1,...: a count of blocks for each of the num_stages stages, adding up to --layers, and
    a block at least on every stage but the last (which holds the head)."""
    try:
        blocks = [int(count) for count in args.partition.split(",")]
    except ValueError:
        fail(f"--partition takes even, balanced, or each stage's blocks as whole numbers N0,N1,..., "
             f"not {args.partition}.")
    if len(blocks) != num_stages:
        fail(f"--partition {args.partition} gives {len(blocks)} stage{'s' * (len(blocks) > 1)}, but this layout "
             f"has {num_stages} (ranks in a pipeline x model chunks a rank): pass {num_stages} counts.")
    if sum(blocks) != args.layers:
        fail(f"--partition {args.partition} adds up to {sum(blocks)} blocks, not --layers {args.layers}: "
             "pass counts that add up to it.")
    empty = [stage for stage, count in enumerate(blocks) if count < (stage < num_stages - 1)]
    if empty:
        fail(f"--partition {args.partition} leaves stage {empty[0]} with {blocks[empty[0]]} blocks: every stage "
             "holds one at least, but the last, which holds the head and may hold none.")


def _check(args, one_process, virtual_stages):
    """Each mistake in the flags, or in how the run was started, ends it with one sentence."""
    world_size, local_world_size = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    for flag in ("layers", "hidden", "classes", "batch_size", "steps", "threads", "virtual_stages", "data_parallel",
                 "tensor_parallel"):
        if getattr(args, flag) < 1:
            fail(f"--{flag.replace('_', '-')} must be at least 1, not {getattr(args, flag)}.")
    if virtual_stages and args.virtual_stages == 1:
        fail("--virtual-stages 1 is one model chunk per rank, which is plain 1F1B: pass 2 or more, or run 03_1f1b.py.")
    for flag in ("lr", "timeout"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag} must be a positive number, not {getattr(args, flag)}.")
    if not 0 <= args.pace < 1e3 * args.timeout:
        fail(f"--pace must be between 0 (off) and --timeout in milliseconds ({1e3 * args.timeout:g}), not {args.pace}.")
    copies, shards = args.data_parallel, args.tensor_parallel
    if world_size % (copies * shards):
        divisors = ", ".join(str(d) for d in range(1, world_size + 1) if world_size % (d * shards) == 0)
        fail(f"--data-parallel {copies}{f' x --tensor-parallel {shards}' * (shards > 1)} cannot split {world_size} "
             f"rank{'s' * (world_size > 1)} into pipelines of equal length: "
             f"{f'pass one of {divisors}, or ' if divisors else ''}start a multiple of {copies * shards} ranks.")
    if args.hidden % shards:
        fail(f"--tensor-parallel {shards} cannot cut --hidden {args.hidden} evenly: pass a multiple of {shards}.")
    if args.batch_size < copies:
        fail(f"--batch-size {args.batch_size} leaves some of the {copies} pipelines without a sample: pass "
             f"--batch-size {copies} or more, or a smaller --data-parallel.")
    share = (f"the smallest pipeline's share of --batch-size ({args.batch_size // copies} of {args.batch_size} "
             f"samples in {copies} pipelines)" if copies > 1 else f"--batch-size ({args.batch_size})")
    if not 1 <= args.micro_batches <= args.batch_size // copies:
        fail(f"--micro-batches must be between 1 and {share}, not {args.micro_batches}.")
    script = os.path.basename(sys.argv[0])
    if one_process and world_size > 1:
        fail(f"{script} trains the whole model in one process: start it with python {script}, not torchrun.")
    num_stages = world_size // (copies * shards)  # ranks in a pipeline
    if args.partition not in ("even", "balanced"):
        _check_partition(args, num_stages * args.virtual_stages)
    elif num_stages * args.virtual_stages > args.layers:
        fail(f"{world_size} rank{'s' * (world_size > 1)}{f' in {copies} pipelines of {num_stages}' * (copies > 1)}"
             f"{f' x {args.virtual_stages} virtual stages' * (args.virtual_stages > 1)}"
             f"{f' ({shards} shards a stage)' * (shards > 1)} cannot share {args.layers} layers: "
             f"pass --layers {num_stages * args.virtual_stages} or more"
             f"{', or fewer --virtual-stages' if virtual_stages and args.virtual_stages > 1 else ''}"
             f"{', or a larger --data-parallel' if copies > 1 else ''}, or start fewer ranks.")
    if torch.cuda.is_available() and local_world_size > torch.cuda.device_count():
        fail(f"{local_world_size} ranks on this node but {torch.cuda.device_count()} GPU(s): start one rank per GPU, "
             "or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run on the CPU.")
    for flag, value in (("--trace", args.trace), ("--svg", args.svg), ("--overhead", args.overhead)):
        if isinstance(value, str) and not os.path.isdir(os.path.dirname(os.path.abspath(value))):
            fail(f"{flag} {value}: its folder does not exist.")
        if value and args.no_instrument:
            fail(f"{flag} needs the spans and meters that --no-instrument turns off: pass one or the other.")
    if args.overhead and args.steps < 3:
        fail(f"--overhead compares the even and odd steps after the first: pass --steps 3 or more, not {args.steps}.")
    for flag, path in (("--dump-grads", args.dump_grads), ("--dump-params", args.dump_params)):
        if path and os.path.exists(path) and not os.path.isdir(path):
            fail(f"{flag} {path}: that is a file, not a folder.")
    if "RANK" not in os.environ and not one_process:
        print(f"note: started without torchrun, so this is a world of one; for four stages run "
              f"torchrun --nproc_per_node=4 {script}", file=sys.stderr)
