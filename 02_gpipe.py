"""GPipe: the batch is split into micro-batches that follow each other through the stages;
all forwards, then all backwards, the gradients adding up over the micro-batches.

    torchrun --nproc_per_node=4 02_gpipe.py

With m micro-batches on n stages the bubble shrinks to (n - 1) / (m + n - 1) of the step,
but every stage keeps all m micro-batches' activations until its backwards start.

    rank 0  F0 F1 F2 F3                   B3 B2 B1 B0
    rank 1     F0 F1 F2 F3             B3 B2 B1 B0
    rank 2        F0 F1 F2 F3       B3 B2 B1 B0
    rank 3           F0 F1 F2 F3 B3 B2 B1 B0
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
from theory import gpipe_bubble

args = parse_args(__doc__, "micro_batches", schedule="gpipe")
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
    """GPipe: all forwards, then all backwards, last micro-batch first; gradients accumulate in .grad."""
    micro_batches = list(zip(inputs.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
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

    for i in range(args.micro_batches):
        input_tensor = recv_forward(i, shapes[i])  # None on the first stage
        send_forward(i, forward(i, input_tensor))  # nothing to send from the last stage
    for i in reversed(range(args.micro_batches)):
        grad_output = recv_backward(i, shapes[i])  # None on the last stage
        send_backward(i, backward(i, grad_output))  # nothing to send from the first stage
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return sum(losses) if stage.is_last else None


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    with timed_step(step):
        optimizer.zero_grad()
        loss = train_step(inputs, labels)
        optimizer.step()
    log_step(step, loss)
report(args, [stage], expected_inflight=lambda rank: args.micro_batches,
       bubble_theory=gpipe_bubble(num_stages, args.micro_batches))
finish()
