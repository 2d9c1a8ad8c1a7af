"""Interleaved 1F1B (Megatron-LM's virtual stages): each rank holds v model chunks instead of one
stage, so a micro-batch passes every rank v times and the pipeline fills and drains v times faster.

    torchrun --nproc_per_node=4 04_interleaved_1f1b.py --virtual-stages 2

Rank r's chunk c is stage c n + r of the n v. The bubble shrinks to (n - 1) / (v m + n - 1). The
price: v times the messages, and rank 0 keeps up to (v + 1) n - 1 chunks' activations, each 1/v of a
1F1B stage's, instead of n stages'. Micro-batches go in groups of n, each group through chunk 0, then
chunk 1 (F2.1: micro-batch 2 in chunk 1); their backwards run the chunks in reverse. n = 2, m = 4:

    rank 0  F0.0 F1.0 F0.1 F1.1      F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1      B3.1 B2.0 B3.0
    rank 1       F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0
"""

import torch
import torch.nn.functional as F

from common import (
    build_stage,
    communicate,
    get_batch,
    setup,
    wait_for_sends,
)
from harness import dump, log_step, parse_args, record, report, timed_step

args = parse_args(__doc__, micro_batches=True, virtual_stages=True)
rank, world_size, device = setup(args)
num_chunks = args.virtual_stages
# this rank's layers only: chunk c is stage c * n + rank of the n * v
stages = [build_stage(args, chunk * world_size + rank, world_size * num_chunks, device) for chunk in range(num_chunks)]
optimizer = torch.optim.Adam([param for stage in stages for param in stage.parameters()], lr=args.lr)

# The k-th forward on every rank: micro-batches in groups of n, each group through chunk 0, then chunk 1,
# ... (a micro-batch leaves a chunk here and is back for the next one n stages later). With chunks, m is
# rounded up to a multiple of n, and the entries past m are holes, which compute and send nothing.
padded = -(-args.micro_batches // world_size) * world_size if num_chunks > 1 else args.micro_batches
table = [(micro_batch, chunk) if micro_batch < args.micro_batches else None
         for group in range(0, padded, world_size) for chunk in range(num_chunks)
         for micro_batch in range(group, min(group + world_size, padded))]


def get_model_chunk_id(k, kind):
    """The chunk of the k-th forward, or of the k-th backward: backwards run the chunks in reverse."""
    return table[k][1] if kind == "forward" else num_chunks - 1 - table[k][1]


def get_num_warmup_microbatches(rank):
    """Forwards, holes included, that rank `rank` runs before its first backward. 1F1B: n - r - 1, all of
    them if m is smaller. With chunks (Megatron-LM's count): one lap of the ring per chunk but the last,
    (v - 1) n, and 2 (n - r - 1), the first micro-batch's trip to the last rank and back."""
    if num_chunks == 1:
        return min(world_size - rank - 1, len(table))
    return min((num_chunks - 1) * world_size + 2 * (world_size - rank - 1), len(table))


def forward_step(micro_batch, chunk, input_tensor, inputs, labels):
    """This model chunk's forward; on the last stage, the loss."""
    stage = stages[chunk]
    with record("forward", micro_batch, chunk):
        output_tensor = stage(inputs if stage.is_first else input_tensor)
        if stage.is_last:
            # sum / batch_size is this micro-batch's share of the batch mean: the shares add up to it
            output_tensor = F.cross_entropy(output_tensor, labels, reduction="sum") / args.batch_size
    return output_tensor


def backward_step(micro_batch, chunk, input_tensor, output_tensor, grad_output):
    """Backpropagate through this model chunk; return the gradient for the previous stage."""
    with record("backward", micro_batch, chunk):
        torch.autograd.backward(output_tensor, grad_tensors=grad_output)  # grad_output is None for the loss
    return None if input_tensor is None else input_tensor.grad


def train_step(inputs, labels):
    """1F1B over the table's (micro-batch, chunk) pairs: warm-up forwards, then one forward and one
    backward in turn, then cool-down backwards."""
    micro_batches = list(zip(inputs.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
    shapes = [micro_inputs.shape for micro_inputs, _ in micro_batches]  # what each receive expects
    input_tensors, output_tensors, losses = [[] for _ in stages], [[] for _ in stages], []  # per chunk, oldest first

    def forward(k, input_tensor):
        if table[k] is None:
            return None
        micro_batch, chunk = table[k][0], get_model_chunk_id(k, "forward")
        output_tensor = forward_step(micro_batch, chunk, input_tensor, *micro_batches[micro_batch])
        input_tensors[chunk].append(input_tensor)
        output_tensors[chunk].append(output_tensor)
        if stages[chunk].is_last:
            losses.append(output_tensor.detach())
        return output_tensor

    def backward(k, grad_output):
        if table[k] is None:
            return None
        micro_batch, chunk = table[k][0], get_model_chunk_id(k, "backward")
        return backward_step(micro_batch, chunk, input_tensors[chunk].pop(0), output_tensors[chunk].pop(0),
                             grad_output)

    def input_of(kind, k):
        """communicate's (micro_batch, chunk, shape) for the k-th forward's or backward's input; None for
        no k, a hole, or past the end."""
        if k is not None and 0 <= k < len(table) and table[k] is not None:
            return table[k][0], get_model_chunk_id(k, kind), shapes[table[k][0]]

    def output_of(kind, sent):
        """communicate's (micro_batch, chunk, tensor) for sent = (k, the k-th forward's or backward's output);
        None where nothing is sent (a hole, or the first stage's backward)."""
        if sent is not None and sent[1] is not None:
            return table[sent[0]][0], get_model_chunk_id(sent[0], kind), sent[1]

    def exchange(name, send_forward=None, send_backward=None, recv_forward=None, recv_backward=None, meanwhile=None):
        """Sends, each (k, tensor), and receives, each k, posted as one group; meanwhile() runs while they travel.
        Returns (input_tensor, grad_output)."""
        return communicate(name, send_forward=output_of("forward", send_forward),
                           send_backward=output_of("backward", send_backward),
                           recv_forward=input_of("forward", recv_forward),
                           recv_backward=input_of("backward", recv_backward), meanwhile=meanwhile)

    num_warmup_microbatches = get_num_warmup_microbatches(rank)
    num_microbatches_remaining = len(table) - num_warmup_microbatches

    # Every send goes in one group with a receive: under NCCL's rules (sends wait to be received) a send on
    # its own can deadlock. 1F1B pairs each send with the receive from the same neighbour. With chunks the
    # ranks form a ring (rank n - 1's chunk c feeds rank 0's chunk c + 1, gradients go back the other way),
    # and those pairs could leave every rank in a send to the previous rank, none receiving. So here, as in
    # Megatron-LM with overlapped P2P, each group goes one way round the ring: a forward's send with the
    # next forward's receive, a backward's send with the next backward's receive. In the steady state each
    # group travels while the next computation runs, and is waited on only when that one is done.
    input_tensor = exchange("recv_forward", recv_forward=0)[0]  # None on the first stage
    for k in range(num_warmup_microbatches):  # warm-up: forwards only
        output_tensor = forward(k, input_tensor)
        input_tensor = exchange("send_forward_recv_forward", send_forward=(k, output_tensor), recv_forward=k + 1)[0]

    if num_chunks > 1:  # the ring receives each gradient an iteration ahead of its backward: the first one now
        grad_output = exchange("recv_backward", recv_backward=0)[1]
    for i in range(num_microbatches_remaining):  # steady state: forward j, then backward i
        j = num_warmup_microbatches + i
        if num_chunks == 1 or i == 0:  # with chunks, later forwards run while the previous group travels
            output_tensor = forward(j, input_tensor)
        if num_chunks == 1:  # 1F1B, as in 03: each send with the receive the same neighbour sends back
            grad_output = exchange("send_forward_recv_backward", send_forward=(j, output_tensor), recv_backward=i)[1]
            grad_input = backward(i, grad_output)
            input_tensor = exchange("send_backward_recv_forward", send_backward=(i, grad_input), recv_forward=j + 1)[0]
        else:  # the ring: activations one way, then gradients the other, each group travelling during a computation
            done = {}
            input_tensor = exchange("send_forward_recv_forward", send_forward=(j, output_tensor), recv_forward=j + 1,
                                    meanwhile=lambda: done.update(grad_input=backward(i, grad_output)))[0]
            next_forward = None if j + 1 == len(table) else lambda: done.update(output=forward(j + 1, input_tensor))
            grad_output = exchange("send_backward_recv_backward", send_backward=(i, done["grad_input"]),
                                   recv_backward=i + 1, meanwhile=next_forward)[1]  # the next iteration's gradient
            output_tensor = done.get("output")

    if num_chunks == 1:  # 1F1B receives each gradient just before its backward: the cool-down's first one now
        grad_output = exchange("recv_backward", recv_backward=num_microbatches_remaining)[1]
    for k in range(num_microbatches_remaining, len(table)):  # cool-down: backwards only
        grad_input = backward(k, grad_output)
        grad_output = exchange("send_backward_recv_backward", send_backward=(k, grad_input), recv_backward=k + 1)[1]
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return sum(losses) if stages[-1].is_last else None


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    with timed_step(step):
        optimizer.zero_grad()
        loss = train_step(inputs, labels)
        if step == 0:
            dump(args.dump_grads, {name: param.grad for stage in stages for name, param in stage.named_parameters()})
        optimizer.step()
    log_step(step, loss)
dump(args.dump_params, {name: param for stage in stages for name, param in stage.named_parameters()})
# Each rank computes 2 v m chunk times of a step that spans 2 v m + 2 (n - 1), and 2 (v - 1) more a hole
# when m < n; with holes after m >= n there is no closed form, and the harness replays the table (README).
holes, compute = padded - args.micro_batches, 2 * num_chunks * args.micro_batches
span = compute + 2 * (world_size - 1) + 2 * (num_chunks - 1) * holes
# alive at a rank's first backward, its peak: the real entries among its first num_warmup_microbatches + 1
report(args, stages, expected_inflight=lambda rank: sum(entry is not None
                                                        for entry in table[:get_num_warmup_microbatches(rank) + 1]),
       bubble_theory=None if holes and args.micro_batches > world_size else 1 - compute / span)
