"""Naive pipeline parallelism: each rank holds one stage of the MLP; the whole batch goes
forward stage by stage, then its gradient comes back (stop-and-wait).

    torchrun --nproc_per_node=4 01_naive.py

Only one rank works at a time; the others wait (the bubble: (n - 1) / n of the step).

    rank 0  F0                   B0
    rank 1     F0             B0
    rank 2        F0       B0
    rank 3           F0 B0
"""

import torch
import torch.nn.functional as F

from common import (
    build_stage,
    finish,
    get_batch,
    parse_args,
    recv_backward,
    recv_forward,
    send_backward,
    send_forward,
    setup,
    wait_for_sends,
)
from harness import log_step, record, report, timed_step
from theory import naive_bubble

args = parse_args(__doc__)
rank, num_stages, device = setup(args)
stage = build_stage(args, rank, num_stages, device)  # this rank's layers only
optimizer = torch.optim.Adam(stage.parameters(), lr=args.lr, fused=True)


def forward_pass(stage, input_tensor, inputs, labels):
    """This stage's forward; on the last stage, the loss."""
    output_tensor = stage(inputs if stage.is_first else input_tensor)
    if stage.is_last:
        # sum / batch_size is this micro-batch's share of the batch mean: the shares add up to it
        output_tensor = F.cross_entropy(output_tensor, labels, reduction="sum") / args.batch_size
    return output_tensor


def forward_step(micro_batch, input_tensor, inputs, labels):
    """The timed forward. With --recompute it runs under no_grad: it saves nothing, and the backward runs it again."""
    with record("forward", micro_batch), torch.set_grad_enabled(not args.recompute):
        return forward_pass(stage, input_tensor, inputs, labels)


def backward_step(micro_batch, input_tensor, output_tensor, grad_output, inputs, labels):
    """Backpropagate: the received activation, a leaf that requires grad, gets the gradient to send back in .grad."""
    with record("full_backward", micro_batch):
        if args.recompute:  # the forward again, from the stage's input: its activations live for this backward only
            output_tensor = forward_pass(stage, input_tensor, inputs, labels)
        torch.autograd.backward(output_tensor, grad_tensors=grad_output)  # grad_output is None for the loss
    return None if input_tensor is None else input_tensor.grad


def train_step(inputs, labels):
    """Stop-and-wait: the whole batch is one micro-batch."""
    micro_batches = [(inputs, labels)]
    shapes = [micro_inputs.shape for micro_inputs, _ in micro_batches]  # what each receive expects
    input_tensors, output_tensors, losses = [], [], []  # stashed for backward

    def forward(i, input_tensor):
        output_tensor = forward_step(i, input_tensor, *micro_batches[i])
        input_tensors.append(input_tensor)
        output_tensors.append(None if args.recompute else output_tensor)  # --recompute: backward makes it again
        if stage.is_last:
            losses.append(output_tensor.detach())
        return output_tensor

    def backward(i, grad_output):
        return backward_step(i, input_tensors.pop(), output_tensors.pop(), grad_output, *micro_batches[i])

    input_tensor = recv_forward(0, shapes[0])  # None on the first stage
    send_forward(0, forward(0, input_tensor))  # nothing to send from the last stage
    grad_output = recv_backward(0, shapes[0])  # None on the last stage
    send_backward(0, backward(0, grad_output))  # nothing to send from the first stage
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return sum(losses) if stage.is_last else None


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    with timed_step(step):
        optimizer.zero_grad()
        loss = train_step(inputs, labels)
        optimizer.step()
    log_step(step, loss)
report(args, [stage], expected_inflight=lambda rank: 1, bubble_theory=naive_bubble(num_stages))
finish()
