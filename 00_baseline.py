"""The ground truth: the whole MLP trained in one process, no pipeline.

    python 00_baseline.py

Every pipelined script must reproduce this script's gradients and losses.

    one process  F (all layers, whole batch)  B
"""

import torch
import torch.nn.functional as F

from common import build_stage, finish, get_batch, parse_args, setup
from harness import log_step, record, report, timed_step

args = parse_args(__doc__, one_process=True)
rank, world_size, device = setup(args)
model = build_stage(args, rank, world_size, device)  # in a world of one, the only stage is the whole model
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)


def forward_pass(inputs, labels):
    """The whole model's forward, and the loss."""
    # sum / batch_size is the batch mean; the pipelines add up per-micro-batch shares of it
    return F.cross_entropy(model(inputs), labels, reduction="sum") / args.batch_size


def train_step(inputs, labels):
    """Forward the whole batch through the whole model, then backward. With --recompute the forward runs
    under no_grad, saving nothing, and the backward runs it again."""
    with record("forward", 0), torch.set_grad_enabled(not args.recompute):
        loss = forward_pass(inputs, labels)
    with record("full_backward", 0):
        if args.recompute:  # the forward again: its activations live for this backward only
            loss = forward_pass(inputs, labels)
        loss.backward()
    return loss.detach()


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    with timed_step(step):
        optimizer.zero_grad()
        loss = train_step(inputs, labels)
        optimizer.step()
    log_step(step, loss)
report(args, [model], expected_inflight=lambda rank: 1, bubble_theory=0.0)
finish()
