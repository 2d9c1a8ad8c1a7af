"""The same MLP, data, loss and optimizer as the numbered scripts, scheduled by PyTorch's own
torch.distributed.pipelining, to compare step times in the same sitting.

    torchrun --nproc_per_node=2 tools/torch_schedules.py --schedule 1f1b
    torchrun --nproc_per_node=2 tools/torch_schedules.py --schedule interleaved-1f1b
    torchrun --nproc_per_node=2 tools/torch_schedules.py --schedule interleaved-zero-bubble
    torchrun --nproc_per_node=2 tools/torch_schedules.py --schedule zbv-zero-bubble

Stage s of n * v stages is common.build_stage(args, s, n * v, device): v = 1 for 1f1b, 2 for
the others. The interleaved schedules put stages r and r + n on rank r (loop), ZBV puts stages
r and 2n - 1 - r there (a V, so rank 0 holds the first stage and the head). Each micro-batch's
loss is cross_entropy(reduction="sum") / batch_size, its share of the batch mean, and
scale_grads=False keeps PyTorch from dividing the summed gradients by the micro-batch count:
the gradients and losses are the baseline's. It prints one JSON line from rank 0.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the lesson's modules, at the root
import common  # noqa: E402
import harness  # noqa: E402

SCHEDULES = {"1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B,
             "interleaved-zero-bubble": ScheduleInterleavedZeroBubble, "zbv-zero-bubble": ScheduleZBVZeroBubble}

parser = harness.flags.model_flags(__doc__, micro_batches=True)  # the scripts' own flags
parser.add_argument("--schedule", choices=SCHEDULES, default="interleaved-1f1b")
parser.set_defaults(no_instrument=True, overhead=False, pace=0.0)  # what common.setup also reads
args = parser.parse_args()
if args.batch_size % args.micro_batches:  # PyTorch sizes its receive buffers from the first micro-batch
    harness.fail(f"--batch-size {args.batch_size} does not split into {args.micro_batches} equal micro-batches.")
rank, n, device = common.setup(args)  # each rank on its own cores, one clock, the run's dtype
v = 1 if args.schedule == "1f1b" else 2
if n * v > args.layers:
    harness.fail(f"{n * v} stages cannot share {args.layers} layers: pass --layers {n * v} or more.")
indices = [rank] if v == 1 else [rank, 2 * n - 1 - rank] if args.schedule == "zbv-zero-bubble" else [rank, rank + n]
modules = [common.build_stage(args, index, n * v, device) for index in indices]
stages = [PipelineStage(module, index, n * v, device) for module, index in zip(modules, indices)]


def loss_fn(output, labels):
    return F.cross_entropy(output, labels, reduction="sum") / args.batch_size  # a share of the batch mean


try:
    schedule = SCHEDULES[args.schedule](stages[0] if v == 1 else stages, args.micro_batches, loss_fn=loss_fn,
                                        scale_grads=False)  # the shares add up: no division by m
except ValueError as error:  # PyTorch's own limits on the micro-batch count
    harness.fail(f"{args.schedule} with {args.micro_batches} micro-batches on {n} ranks: {error}")
optimizer = torch.optim.Adam([p for module in modules for p in module.parameters()], lr=args.lr)
has_first, has_last = any(stage.is_first for stage in stages), any(stage.is_last for stage in stages)

times, losses = [], []
for step in range(args.steps):
    inputs, labels = common.get_batch(args, step, device)
    start = time.perf_counter()
    optimizer.zero_grad()
    micro_losses = []
    schedule.step(*([inputs] if has_first else []), target=labels if has_last else None,
                  losses=micro_losses if has_last else None, return_outputs=False)
    optimizer.step()
    times.append([start, time.perf_counter()])
    losses.append(sum(micro_losses).item() if has_last else 0.0)

# A step runs from its first start on any rank to its last end on any rank (one clock on one host).
everyone = [torch.zeros(args.steps, 2, dtype=torch.float64, device=device) for _ in range(n)]
dist.all_gather(everyone, torch.tensor(times, dtype=torch.float64, device=device))
losses = torch.tensor(losses, dtype=torch.float64, device=device)
dist.all_reduce(losses)  # only the rank holding the last stage has non-zero losses
if rank == 0:
    step_ms = [1e3 * (max(float(t[s, 1]) for t in everyone) - min(float(t[s, 0]) for t in everyone))
               for s in (range(1, args.steps) if args.steps > 1 else [0])]  # the first step warms up
    print(json.dumps({"script": "torch_schedules.py", "schedule": args.schedule, "world_size": n,
                      "virtual_stages": v, "num_microbatches": args.micro_batches,
                      "step_ms_median": sorted(step_ms)[len(step_ms) // 2], "losses": losses.tolist()}), flush=True)
harness.finish()
