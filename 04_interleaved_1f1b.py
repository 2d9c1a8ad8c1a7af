"""Interleaved 1F1B (Megatron-LM's virtual stages): each rank holds v model chunks instead of one
stage, so a micro-batch passes every rank v times and the pipeline fills and drains v times faster.

    torchrun --nproc_per_node=4 04_interleaved_1f1b.py --virtual-stages 2

Rank r's chunk c is stage c n + r of the n v. The bubble shrinks to (n - 1) / (v m + n - 1), for v times
the messages; rank 0 keeps up to (v + 1) n - 1 chunks' activations (each 1/v of a stage's), not n stages'.
Micro-batches go in groups of n through chunk 0, then chunk 1 (f2: micro-batch 2 in chunk 1). n = 2, m = 4:

    rank 0  F0 F1 f0 f1 F2 b0 F3 b1 f2 B0 f3 B1    b2    b3 B2 B3
    rank 1     F0 F1 f0 b0 f1 b1 F2 B0 F3 B1 f2 b2 f3 b3 B2 B3
"""

import torch
import torch.nn.functional as F

from common import Recv, Send, build_stage, finish, get_batch, parse_args, post, setup, stage_of, wait_for_sends
from harness import log_step, record, report, timed_step
from schedules import interleaved_1f1b
from theory import UNIT_SPANS, busiest_bubble, peak_inflight

args = parse_args(__doc__, "micro_batches", "virtual_stages", schedule="interleaved-1f1b")
rank, num_stages, device = setup(args)
num_chunks = args.virtual_stages
# this rank's layers only: chunk c is stage c * n + rank of the n * v
stages = [build_stage(args, chunk * num_stages + rank, num_stages * num_chunks, device) for chunk in range(num_chunks)]
optimizer = torch.optim.Adam([param for stage in stages for param in stage.parameters()], lr=args.lr, fused=True)
# forwards (and backwards) per rank, Megatron-LM's m v: m rounded up to a multiple of n, those past m holes
total_num_microbatches = -(-args.micro_batches // num_stages) * num_stages * num_chunks


def get_model_chunk_id(k, forward):
    """The chunk of the k-th forward, or of the k-th backward: backwards run the chunks in reverse."""
    chunk = k % (num_stages * num_chunks) // num_stages
    return chunk if forward else num_chunks - 1 - chunk


def get_microbatch_id(k):
    """The micro-batch of the k-th forward or backward: groups of n, each through chunk 0, then chunk 1, ..."""
    return k // (num_stages * num_chunks) * num_stages + k % num_stages


def forward_pass(stage, input_tensor, inputs, labels):
    """This stage's forward; on the last stage, the loss."""
    output_tensor = stage(inputs if stage.is_first else input_tensor)
    if stage.is_last:
        # sum / batch_size is this micro-batch's share of the batch mean: the shares add up to it
        output_tensor = F.cross_entropy(output_tensor, labels, reduction="sum") / args.batch_size
    return output_tensor


def forward_step(micro_batch, chunk, input_tensor, inputs, labels):
    """The timed forward. With --recompute it runs under no_grad: it saves nothing, and the backward runs it again."""
    stage = stages[chunk]
    with record("forward", micro_batch, chunk), torch.set_grad_enabled(not args.recompute):
        return forward_pass(stage, input_tensor, inputs, labels)


def backward_step(micro_batch, chunk, input_tensor, output_tensor, grad_output, inputs, labels):
    """Backpropagate: the received activation, a leaf that requires grad, gets the gradient to send back in .grad."""
    stage = stages[chunk]
    with record("full_backward", micro_batch, chunk):
        if args.recompute:  # the forward again, from the stage's input: its activations live for this backward only
            output_tensor = forward_pass(stage, input_tensor, inputs, labels)
        torch.autograd.backward(output_tensor, grad_tensors=grad_output)  # grad_output is None for the loss
    return None if input_tensor is None else input_tensor.grad


def train_step(inputs, labels):
    """1F1B: warm-up forwards, then one forward and one backward in turn, then cool-down backwards."""
    micro_batches = list(zip(inputs.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
    shapes = [micro_inputs.shape for micro_inputs, _ in micro_batches]  # what each receive expects
    input_tensors, output_tensors, losses = [[] for _ in stages], [[] for _ in stages], []  # per chunk, oldest first

    def forward(i, input_tensor):
        micro_batch, chunk = get_microbatch_id(i), get_model_chunk_id(i, forward=True)
        if micro_batch >= args.micro_batches:  # a hole
            return None
        output_tensor = forward_step(micro_batch, chunk, input_tensor, *micro_batches[micro_batch])
        input_tensors[chunk].append(input_tensor)
        output_tensors[chunk].append(None if args.recompute else output_tensor)  # --recompute: backward makes it again
        if stages[chunk].is_last:
            losses.append(output_tensor.detach())
        return output_tensor

    def backward(i, grad_output):
        micro_batch, chunk = get_microbatch_id(i), get_model_chunk_id(i, forward=False)
        if micro_batch >= args.micro_batches:  # a hole
            return None
        return backward_step(micro_batch, chunk, input_tensors[chunk].pop(0), output_tensors[chunk].pop(0), grad_output,
                             *micro_batches[micro_batch])

    def post_ring(k, output_tensor, forward):
        """One group one way round the ring: the k-th forward's (or backward's) output and the next one's input."""
        operations = [] if output_tensor is None else [
            Send(get_microbatch_id(k), output_tensor, not forward, get_model_chunk_id(k, forward))]
        micro_batch = get_microbatch_id(k + 1)  # past m v, or past m, there is nothing to receive
        if k + 1 < total_num_microbatches and micro_batch < args.micro_batches:
            operations.append(Recv(micro_batch, shapes[micro_batch], not forward, get_model_chunk_id(k + 1, forward)))
        return post(*operations)

    def received(pending):
        """The tensor a group posted by post_ring receives, or None: it receives nothing (a hole, or the end)."""
        tensors = pending.wait()
        return tensors[0] if tensors else None

    # Megatron-LM's warm-up: a lap of the ring per chunk but the last, and 2 (n - r - 1), a trip to rank n - 1 and back
    num_warmup_microbatches = min((num_chunks - 1) * num_stages + 2 * (num_stages - rank - 1), total_num_microbatches)
    num_microbatches_remaining = total_num_microbatches - num_warmup_microbatches

    # The ranks form a ring (rank n - 1's chunk c feeds rank 0's chunk c + 1): 1F1B's pairs could leave every rank
    # in a send to the previous rank under NCCL's rules. As in Megatron-LM, each group goes one way round the ring
    # and travels while the next computation runs; a group that receives nothing (a hole) gives None.
    input_tensor = received(post_ring(-1, None, forward=True))  # None on the first stage
    for i in range(num_warmup_microbatches):  # warm-up: forwards only
        input_tensor = received(post_ring(i, forward(i, input_tensor), forward=True))

    pending = post_ring(-1, None, forward=False)  # each gradient is received an iteration ahead of its backward
    for i in range(num_microbatches_remaining):  # steady state: forward j, then backward i
        j = num_warmup_microbatches + i
        output_tensor = forward(j, input_tensor)
        grad_output = received(pending)
        pending = post_ring(j, output_tensor, forward=True)  # activations one way round the ring,
        grad_input = backward(i, grad_output)
        input_tensor = received(pending)
        pending = post_ring(i, grad_input, forward=False)  # then gradients the other way

    for i in range(num_microbatches_remaining, total_num_microbatches):  # cool-down: backwards only
        grad_output = received(pending)
        pending = post_ring(i, backward(i, grad_output), forward=False)
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return sum(losses) if stages[-1].is_last else None


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    with timed_step(step):
        optimizer.zero_grad()
        loss = train_step(inputs, labels)
        optimizer.step()
    log_step(step, loss)
tables = interleaved_1f1b(num_stages, args.micro_batches, num_chunks)  # this order as a table: the theory's count
report(args, stages, expected_inflight=lambda rank: peak_inflight(tables)[rank],
       bubble_theory=busiest_bubble(tables, stage_of, num_stages * num_chunks, cost=UNIT_SPANS))
finish()
