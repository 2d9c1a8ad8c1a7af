"""The same MLP, data, loss and optimizer as the numbered scripts, scheduled by PyTorch's own
torch.distributed.pipelining, to compare step times in the same sitting, or to run a table of ours.

    torchrun --nproc_per_node=2 tools/torch_schedules.py --schedule 1f1b
    torchrun --nproc_per_node=2 tools/torch_schedules.py --schedule interleaved-1f1b --virtual-stages 2
    torchrun --nproc_per_node=2 tools/torch_schedules.py --schedule zbv
    python tools/plan.py --stages 2 --micro-batches 8 --costs 1,2,1 --save plan.csv
    torchrun --nproc_per_node=2 tools/torch_schedules.py --schedule plan.csv  # in PyTorch's _PipelineScheduleRuntime

--schedule names PyTorch's class for a schedule of ours (SCHEDULES below), or a compute_only CSV that
_PipelineScheduleRuntime._load_csv runs. Stage s of n v stages is common.build_stage(args, s, n v, device), placed
as ours: the loop (rank r holds r, r + n, ...) or the V (r and 2n - 1 - r). Each micro-batch's loss is
cross_entropy(reduction="sum") / batch_size, its share of the batch mean, and scale_grads=False keeps PyTorch
from dividing the summed gradients by the micro-batch count: the gradients and losses are the baseline's. It
prints one JSON line from rank 0.
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as pytorch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the lesson's modules, at the root
import common  # noqa: E402
import harness  # noqa: E402
import schedules  # noqa: E402
import theory  # noqa: E402

SCHEDULES = {"gpipe": pytorch.ScheduleGPipe, "1f1b": pytorch.Schedule1F1B,  # ours by name: PyTorch's class
             "interleaved-1f1b": pytorch.ScheduleInterleaved1F1B, "zbv": pytorch.ScheduleZBVZeroBubble,
             "dualpipev": pytorch.ScheduleDualPipeV, "looped-bfs": pytorch.ScheduleLoopedBFS,
             "interleaved-zero-bubble": pytorch.ScheduleInterleavedZeroBubble}

parser = harness.flags.model_flags(__doc__, common.FLAGS, common.EVERY_SCRIPT + ("micro_batches",))  # the scripts'
harness.flags.declare(parser, "--schedule", "--virtual-stages", "--dump-grads", schedules=", ".join(SCHEDULES))
parser.set_defaults(no_instrument=True, overhead=False, pace=0.0, virtual_stages=None)  # what common.setup reads
args = parser.parse_args()
if not 1 <= args.micro_batches <= args.batch_size:
    harness.fail(f"--micro-batches must be between 1 and --batch-size ({args.batch_size}), not {args.micro_batches}.")
if args.batch_size % args.micro_batches:  # PyTorch sizes its receive buffers from the first micro-batch
    harness.fail(f"--batch-size {args.batch_size} does not split into {args.micro_batches} equal micro-batches.")
if not args.schedule.endswith(".csv") and args.schedule not in SCHEDULES:
    harness.fail(f"--schedule {args.schedule}: pass one of {', '.join(SCHEDULES)}, or a FILE.csv.")
try:  # our placement and chunks for it, checked as 09 checks them
    table = schedules.load(args.schedule, int(os.environ.get("WORLD_SIZE", 1)), args.micro_batches,
                           args.virtual_stages)
except ValueError as error:
    harness.fail(f"--schedule {args.schedule}: {error}")
args.virtual_stages = table.num_chunks
harness.before_setup(args)  # cores and threads, as the scripts' parse_args gives them
rank, n, device = common.setup(args)  # each rank on its own cores, one clock, the run's dtype
harness.guarantees.uninstall()  # PyTorch's runtime posts and waits for its own groups: torch's calls as they are
v = table.num_chunks
if n * v > args.layers:
    harness.fail(f"{n * v} stages cannot share {args.layers} layers: pass --layers {n * v} or more.")
indices = [theory.stage(table.placement, n, rank, chunk) for chunk in range(v)]
modules = [common.build_stage(args, index, n * v, device) for index in indices]
stages = [PipelineStage(module, index, n * v, device) for module, index in zip(modules, indices)]


def loss_fn(output, labels):
    return F.cross_entropy(output, labels, reduction="sum") / args.batch_size  # a share of the batch mean


try:
    if args.schedule.endswith(".csv"):  # PyTorch's runtime, the table's own order
        schedule = pytorch._PipelineScheduleRuntime(stages, args.micro_batches, loss_fn=loss_fn, scale_grads=False)
        schedule._load_csv(args.schedule, format="compute_only")
    else:
        one_stage = issubclass(SCHEDULES[args.schedule], pytorch.PipelineScheduleSingle)
        schedule = SCHEDULES[args.schedule](stages[0] if one_stage else stages, args.micro_batches, loss_fn=loss_fn,
                                            scale_grads=False)  # the shares add up: no division by m
except ValueError as error:  # PyTorch's own limits on the micro-batch count
    harness.fail(f"{args.schedule} with {args.micro_batches} micro-batches on {n} ranks: {error}")
optimizer = torch.optim.Adam([p for module in modules for p in module.parameters()], lr=args.lr, fused=True)
has_first, has_last = any(stage.is_first for stage in stages), any(stage.is_last for stage in stages)

times, losses = [], []
for step in range(args.steps):
    inputs, labels = common.get_batch(args, step, device)
    start, cpu_start = time.perf_counter(), time.process_time()
    optimizer.zero_grad()
    micro_losses = []
    schedule.step(*([inputs] if has_first else []), target=labels if has_last else None,
                  losses=micro_losses if has_last else None, return_outputs=False)
    if step == 0:
        harness.dump(args.dump_grads, {name: p.grad for module in modules for name, p in module.named_parameters()})
    optimizer.step()
    times.append([start, time.perf_counter(), time.process_time() - cpu_start])
    losses.append(sum(micro_losses).item() if has_last else 0.0)

# A step runs from its first start on any rank to its last end on any rank (one clock on one host); its CPU time is
# what each rank's process, all its threads, used in it, as the scripts' step_cpu_ms.
everyone = [torch.zeros(args.steps, 3, dtype=torch.float64, device=device) for _ in range(n)]
dist.all_gather(everyone, torch.tensor(times, dtype=torch.float64, device=device))
losses = torch.tensor(losses, dtype=torch.float64, device=device)
dist.all_reduce(losses)  # only the rank holding the last stage has non-zero losses
if rank == 0:
    measured = range(1, args.steps) if args.steps > 1 else [0]  # the first step warms up
    step_ms = [1e3 * (max(float(t[s, 1]) for t in everyone) - min(float(t[s, 0]) for t in everyone)) for s in measured]
    cpu_ms = [1e3 * statistics.median_high([float(t[s, 2]) for s in measured]) for t in everyone]
    print(json.dumps({"script": "torch_schedules.py", "schedule": args.schedule, "world_size": n,
                      "virtual_stages": v, "num_microbatches": args.micro_batches,
                      "step_ms_median": statistics.median_high(step_ms), "step_cpu_ms": cpu_ms,
                      "losses": losses.tolist()}), flush=True)
common.finish()
