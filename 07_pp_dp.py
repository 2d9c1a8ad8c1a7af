"""Pipelines side by side (data parallelism across pipelines): d copies of one 1F1B pipeline,
each fed its own share of the batch, each stage's gradients summed over its copies before the
optimizer step.

    torchrun --nproc_per_node=6 07_pp_dp.py --data-parallel 2 --micro-batches 4

The world is a grid of d rows of n = world / d stages: rank copy * n + stage. A pipeline is n
consecutive ranks; the copies of a stage, one in each pipeline, are n ranks apart and sum their
gradients with an all-reduce (AR). Each stage starts it as soon as its own last backward is done,
while the stages before it are still in their cool-down: only the first stage's adds to the step.
Ranks 0-2 are pipeline 0, fed the batch's first half; ranks 3-5 pipeline 1, fed its second half.

    rank 0  F0 F1 F2       B0 F3 B1    B2    B3 AR
    rank 1     F0 F1    B0 F2 B1 F3 B2    B3 AR
    rank 2        F0 B0 F1 B1 F2 B2 F3 B3 AR
    rank 3  F0 F1 F2       B0 F3 B1    B2    B3 AR
    rank 4     F0 F1    B0 F2 B1 F3 B2    B3 AR
    rank 5        F0 B0 F1 B1 F2 B2 F3 B3 AR
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from common import (
    build_stage,
    device_mesh,
    finish,
    get_batch,
    parse_args,
    recv_backward,
    recv_forward,
    send_backward,
    send_backward_recv_forward,
    send_forward,
    send_forward_recv_backward,
    setup,
    wait_for_sends,
)
from harness import log_step, record, report, timed_step
from theory import gpipe_bubble, one_f_one_b_inflight

args = parse_args(__doc__, "micro_batches", "data_parallel", schedule="1f1b")
rank, num_stages, device = setup(args, data_parallel=True)  # within this rank's pipeline: its stage, the stage count
mesh = device_mesh()  # mesh["pp"]: this rank's pipeline; mesh["dp"]: the copies of its stage, one in each pipeline
copy, num_copies = mesh.get_local_rank("dp"), mesh.size(0)  # which pipeline this rank is in, of how many
stage = build_stage(args, rank, num_stages, device)  # this rank's layers only
optimizer = torch.optim.Adam(stage.parameters(), lr=args.lr, fused=True)


def forward_pass(stage, input_tensor, inputs, labels):
    """This stage's forward; on the last stage, the loss."""
    output_tensor = stage(inputs if stage.is_first else input_tensor)
    if stage.is_last:
        # sum / batch_size, the whole batch's size: the shares of every pipeline's micro-batches add up to its mean
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


def all_reduce(loss):
    """Start summing this stage's gradients (and the last stage's loss) over its copies, one in each
    pipeline: each copy then holds the whole batch's. Waited for before the optimizer step."""
    tensors = [param.grad for param in stage.parameters()] + ([loss] if stage.is_last else [])
    return [dist.all_reduce(tensor, group=mesh.get_group("dp"), async_op=True) for tensor in tensors]


def train_step(inputs, labels):
    """1F1B: warm-up forwards, then one forward and one backward in turn, then cool-down backwards;
    then the all-reduce starts. Returns the loss and the all-reduce, to be waited for."""
    micro_batches = list(zip(inputs.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
    shapes = [micro_inputs.shape for micro_inputs, _ in micro_batches]  # what each receive expects
    input_tensors, output_tensors, losses = [], [], []  # stashed for backward, oldest first

    def forward(i, input_tensor):
        output_tensor = forward_step(i, input_tensor, *micro_batches[i])
        input_tensors.append(input_tensor)
        output_tensors.append(None if args.recompute else output_tensor)  # --recompute: backward makes it again
        if stage.is_last:
            losses.append(output_tensor.detach())
        return output_tensor

    def backward(i, grad_output):
        return backward_step(i, input_tensors.pop(0), output_tensors.pop(0), grad_output, *micro_batches[i])

    # Stage r runs n - r - 1 forwards ahead of its first backward (all of them if m is smaller).
    num_warmup_microbatches = min(num_stages - rank - 1, args.micro_batches)
    num_microbatches_remaining = args.micro_batches - num_warmup_microbatches

    for i in range(num_warmup_microbatches):  # warm-up: forwards only
        input_tensor = recv_forward(i, shapes[i])  # None on the first stage
        send_forward(i, forward(i, input_tensor))  # nothing to send from the last stage

    if num_microbatches_remaining > 0:
        input_tensor = recv_forward(num_warmup_microbatches, shapes[num_warmup_microbatches])
    for i in range(num_microbatches_remaining):  # steady state: forward j, then backward i
        j = num_warmup_microbatches + i
        output_tensor = forward(j, input_tensor)
        # Each send is posted together with the receive the neighbour sends back. With sends
        # that wait to be received, as NCCL's do, two separate calls would deadlock: both
        # neighbours would sit in their sends, each waiting for the other to receive.
        grad_output = send_forward_recv_backward(j, output_tensor, i, shapes[i])
        grad_input = backward(i, grad_output)
        if j + 1 < args.micro_batches:
            input_tensor = send_backward_recv_forward(i, grad_input, j + 1, shapes[j + 1])
        else:
            send_backward(i, grad_input)

    for i in range(num_microbatches_remaining, args.micro_batches):  # cool-down: backwards only
        grad_output = recv_backward(i, shapes[i])  # None on the last stage
        send_backward(i, backward(i, grad_output))  # nothing to send from the first stage
    loss = sum(losses) if stage.is_last else None
    sums = all_reduce(loss)  # runs while the stages before this one finish their cool-down
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return loss, sums


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    # this pipeline's share of the batch: contiguous, one sample larger in the first pipelines if d does not divide it
    inputs, labels = inputs.tensor_split(num_copies)[copy], labels.tensor_split(num_copies)[copy]
    with timed_step(step):
        optimizer.zero_grad()
        loss, sums = train_step(inputs, labels)
        for request in sums:  # the optimizer needs the whole batch's gradient
            request.wait()
        optimizer.step()
    log_step(step, loss if copy == num_copies - 1 else None)  # once a step, by the last rank
# rank: a rank of the world, whose stage is rank % num_stages
report(args, [stage],
       expected_inflight=lambda rank: one_f_one_b_inflight(num_stages, args.micro_batches, rank % num_stages),
       bubble_theory=gpipe_bubble(num_stages, args.micro_batches))
finish()
