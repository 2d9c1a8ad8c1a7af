"""The flags every script takes, their checks, and ending a run with one sentence."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import schedules
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


def model_flags(doc, micro_batches=False, v_shape=False):
    """The flags of the model, the data, the training and the processes, which every script and
    tools/torch_schedules.py take. v_shape (06): two model chunks per rank, placed as a V."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.error = lambda message: fail(f"{message} (see --help)")  # one sentence, not argparse's usage
    # what a script runs with where it takes no such flag (a flag's own default wins where it takes one)
    parser.set_defaults(micro_batches=1, virtual_stages=2 if v_shape else 1, data_parallel=1, tensor_parallel=1,
                        sync_sends=False)
    parser.add_argument("--layers", type=int, default=16, help="hidden blocks (Linear + ReLU) before the head")
    parser.add_argument("--hidden", type=int, default=1024, help="width of every block")
    parser.add_argument("--batch-size", type=int, default=256, help="samples per optimizer step")
    if micro_batches:
        parser.add_argument("--micro-batches", type=int, default=8, help="micro-batches each batch is split into")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the data")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    cores_per_rank = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    parser.add_argument("--threads", type=int, default=cores_per_rank,
                        help="torch threads per rank (default: cores / ranks on this host)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a rank waits on another, then gives up")
    return parser


def parse_args(doc, micro_batches=False, one_process=False, virtual_stages=False, data_parallel=False, v_shape=False,
               tensor_parallel=False, schedule=False):
    """The flags every script takes; each mistake ends the run with one sentence. v_shape (06): two model
    chunks per rank, placed as a V, and no --virtual-stages flag. schedule (09): --schedule names the table."""
    parser = model_flags(doc, micro_batches, v_shape)
    if schedule:
        parser.add_argument("--schedule", default="1f1b", metavar="NAME",
                            help=f"the table to run, one of: {', '.join([*schedules.SCHEDULES, 'search'])}")
        looping = [name for name in schedules.SCHEDULES if schedules.takes_virtual_stages(name)]
        parser.add_argument("--virtual-stages", type=int, default=None, metavar="V",
                            help=f"model chunks per rank, for the schedules that take them ({', '.join(looping)}; "
                                 "default 2); for --schedule search, the loop's it may try besides one (default 1)")
        parser.add_argument("--costs", metavar="F,B,W[,MSG]",
                            help="--schedule search: a stage's F, B and W times and a message's, as tools/plan.py "
                                 "takes them (default 1,1,1)")
        parser.add_argument("--memory", type=float, metavar="K",
                            help="--schedule search: the most activations a rank may hold, in micro-batches of a "
                                 "stage (default: the ranks, 1F1B's)")
    if virtual_stages:
        parser.add_argument("--virtual-stages", type=int, default=2, help="model chunks per rank")
    if data_parallel:
        parser.add_argument("--data-parallel", type=int, default=1, metavar="D",
                            help="pipelines side by side, world / D stages each, their gradients summed")
    if tensor_parallel:
        parser.add_argument("--tensor-parallel", type=int, default=1, metavar="T", help="shards a stage, cut by width")
    if not one_process:
        parser.add_argument("--sync-sends", action="store_true",
                            help="NCCL's rules on gloo: a rank's groups run in turn, each done once its sends are "
                                 "received, and tags are ignored")
    parser.add_argument("--pace", type=float, default=0.0, metavar="MS",
                        help="pad every forward, backward and weight-gradient span to MS milliseconds by sleeping, "
                             "so the timeline shows the schedule alone")
    parser.add_argument("--recompute", action="store_true", help="keep only each stage's input from F to B; B reruns F")
    parser.add_argument("--json", action="store_true", help="print one JSON line with the run's measurements")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace (Perfetto, chrome://tracing) of the run")
    parser.add_argument("--svg", metavar="FILE", help="draw the last step's timeline as a picture (SVG)")
    parser.add_argument("--dump-grads", metavar="DIR", help="write each rank's gradients after the first backward")
    parser.add_argument("--dump-params", metavar="DIR", help="write each rank's parameters after the last step")
    parser.add_argument("--no-instrument", action="store_true", help="skip the timing and memory hooks (their cost)")
    parser.add_argument("--overhead", action="store_true",
                        help="instrument the even steps only, and compare their time with the odd steps'")
    args = parser.parse_args()
    if schedule:
        _check_schedule(args)
    _check(args, one_process, virtual_stages)
    return args


def _check_schedule(args):
    """09: a schedule we have, --virtual-stages, --costs and --memory only where they mean something, and a layout
    its table can take. Sets args.placement, args.virtual_stages (the model chunks a rank holds) and, for the
    search, the defaults of --costs and --memory."""
    names = [*schedules.SCHEDULES, "search"]
    if args.schedule not in names:
        fail(f"--schedule {args.schedule} is not a schedule of ours: pass one of {', '.join(names)}.")
    num_ranks = int(os.environ.get("WORLD_SIZE", 1))
    for flag, value in (("--costs", args.costs), ("--memory", args.memory)):
        if value is not None and args.schedule != "search":
            fail(f"{flag} is for --schedule search, which finds a table for them: leave it out of {args.schedule}.")
    if args.schedule == "search":
        looped = 1 if args.virtual_stages is None else args.virtual_stages  # chunks a rank the loop may take too
        if looped < 1:
            fail(f"--virtual-stages {looped}: --schedule search may try the loop at that many chunks a rank as well "
                 "as at one; pass 1 or more.")
        args.costs = args.costs or "1,1,1"
        args.memory = num_ranks if args.memory is None else args.memory  # 1F1B's
        if num_ranks * looped > args.layers:  # too few layers for the chunks asked for: _check says what to do
            args.placement, args.virtual_stages = "loop", looped
            return
        try:
            cost, message = theory.parse_costs(args.costs)
            found = schedules.best_search(num_ranks, max(1, args.micro_batches), cost, args.memory, message, looped,
                                          most_chunks=args.layers // num_ranks)
        except ValueError as error:
            fail(f"--schedule search on {num_ranks} rank{'s' * (num_ranks > 1)}: {error}")
        args.placement, args.virtual_stages, _ = found  # 09 searches its placement again: the same table
        return
    args.placement = schedules.SCHEDULES[args.schedule][1]
    if schedules.takes_virtual_stages(args.schedule):
        args.virtual_stages = 2 if args.virtual_stages is None else args.virtual_stages
    elif args.virtual_stages is not None:
        chunks = "two model chunks on each rank, as a V" if args.placement == "v" else "one model chunk on each rank"
        fail(f"--schedule {args.schedule} places {chunks}, so --virtual-stages means nothing to it: leave it out.")
    else:
        args.virtual_stages = 2 if args.placement == "v" else 1
    try:
        schedules.table(args.schedule, num_ranks, max(1, args.micro_batches), max(1, args.virtual_stages))
    except ValueError as error:
        fail(f"--schedule {args.schedule} on {num_ranks} rank{'s' * (num_ranks > 1)}: {error}")


def _check(args, one_process, virtual_stages):
    """Each mistake in the flags, or in how the run was started, ends it with one sentence."""
    world_size, local_world_size = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    for flag in ("layers", "hidden", "batch_size", "steps", "threads", "virtual_stages", "data_parallel",
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
    if num_stages * args.virtual_stages > args.layers:
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
