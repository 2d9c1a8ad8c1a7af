"""The third axis (Megatron-LM's PTD-P): d copies of one 1F1B pipeline, each stage's blocks cut by
width across t shards (tensor parallelism), each stage's gradients summed over its copies before the
optimizer step.

    torchrun --nproc_per_node=12 08_3d.py --data-parallel 2 --tensor-parallel 2 --micro-batches 4

The world is a grid of d x n x t: rank (copy * n + stage) * t + shard. A stage's t shards are
neighbouring ranks and run its schedule in step: each forward and backward holds their all-reduces (TP),
one for each pair of blocks each way, and each shard sends the whole activation to its counterpart in
the next stage. The copies of a stage, one in each pipeline, are n t ranks apart and sum their
gradients with an all-reduce (AR), which only the first stage's adds to the step. Ranks 0-5 are
pipelines 0 and 1 (a pipeline of each shard), fed the batch's first half; ranks 6-11 its second half.

    ranks 0, 1    F0 F1 F2       B0 F3 B1    B2    B3 AR
    ranks 2, 3       F0 F1    B0 F2 B1 F3 B2    B3 AR
    ranks 4, 5          F0 B0 F1 B1 F2 B2 F3 B3 AR
    ranks 6, 7    F0 F1 F2       B0 F3 B1    B2    B3 AR
    ranks 8, 9       F0 F1    B0 F2 B1 F3 B2    B3 AR
    ranks 10, 11        F0 B0 F1 B1 F2 B2 F3 B3 AR
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

args = parse_args(__doc__, "micro_batches", "data_parallel", "tensor_parallel", schedule="1f1b")
rank, num_stages, device = setup(args, data_parallel=True, tensor_parallel=True)  # its stage, the stage count
mesh = device_mesh()  # mesh["pp"]: this rank's pipeline; mesh["dp"]: its stage's copies; mesh["tp"]: its shards
copy, num_copies = mesh.get_local_rank("dp"), mesh.size(0)  # which pipeline this rank is in, of how many
shard, num_shards = mesh.get_local_rank("tp"), mesh.size(2)  # which slice of its stage's blocks it holds, of how many


def sum_over_shards(tensor):
    """The tensor summed over this stage's shards: an all-reduce, whose result is the same bits on every shard."""
    total = tensor.clone(memory_format=torch.contiguous_format)  # all_reduce sums into its tensor
    dist.all_reduce(total, group=mesh.get_group("tp"))
    return total


def gather_over_shards(tensor, dim=-1):
    """The shards' slices of a tensor, joined along dim in shard order: the whole tensor, on every shard."""
    slices = [torch.empty_like(tensor) for _ in range(num_shards)]
    dist.all_gather(slices, tensor.contiguous(), group=mesh.get_group("tp"))
    return torch.cat(slices, dim)


class CopyToShards(torch.autograd.Function):
    """Megatron-LM's f, before a column-parallel block: the identity forward; backward, the shards' parts of
    the input's gradient summed (each shard's output slice depends on the whole input)."""
    forward = staticmethod(lambda ctx, input_tensor: input_tensor)
    backward = staticmethod(lambda ctx, grad_output: sum_over_shards(grad_output))


class ReduceFromShards(torch.autograd.Function):
    """Megatron-LM's g, its conjugate, after a row-parallel block: forward, the shards' partial outputs summed;
    the identity backward (the output's gradient is whole, and the same bits, on every shard)."""
    forward = staticmethod(lambda ctx, partial_output: sum_over_shards(partial_output))
    backward = staticmethod(lambda ctx, grad_output: grad_output)


class GatherFromShards(torch.autograd.Function):
    """After a column-parallel block that ends a stage: forward, the output's slices joined; backward, this
    shard's slice of the output's gradient."""
    forward = staticmethod(lambda ctx, output_slice: gather_over_shards(output_slice))
    backward = staticmethod(lambda ctx, grad_output: grad_output.chunk(num_shards, dim=-1)[shard])


def cut(whole, dim):
    """This shard's slice of one of the baseline's parameters, along dim (noted: the harness joins the shards to
    write the baseline's tensors)."""
    part = torch.nn.Parameter(whole.detach().chunk(num_shards, dim)[shard].clone())
    part.partition_dim = dim  # Megatron-LM's name
    return part


class ColumnParallelLinear(torch.nn.Module):
    """This shard's rows of a Linear's weight and bias: its slice of the output features, from the whole input."""

    def __init__(self, linear, gather_output):
        super().__init__()
        self.weight, self.bias, self.gather_output = cut(linear.weight, 0), cut(linear.bias, 0), gather_output

    def forward(self, input_tensor):
        output_slice = F.linear(CopyToShards.apply(input_tensor), self.weight, self.bias)
        return GatherFromShards.apply(output_slice) if self.gather_output else output_slice  # ReLU commutes with it


class RowParallelLinear(torch.nn.Module):
    """This shard's columns of a Linear's weight, and its whole bias: from its slice of the input, the output."""

    def __init__(self, linear):
        super().__init__()
        self.weight, self.bias = cut(linear.weight, 1), linear.bias  # the bias whole, the same bits on every shard

    def forward(self, input_slice):
        return ReduceFromShards.apply(F.linear(input_slice, self.weight)) + self.bias


def parallelize(stage):
    """Megatron-LM's pairs: the stage's blocks in turn column- and row-parallel; an odd last block
    column-parallel, its output gathered. The head stays whole, as its input is."""
    names = list(stage.blocks) if num_shards > 1 else []  # one shard: the baseline's Linears, 07 bit for bit
    for index, name in enumerate(names):
        linear = stage.blocks[name]
        stage.blocks[name] = RowParallelLinear(linear) if index % 2 else ColumnParallelLinear(
            linear, gather_output=index == len(names) - 1)
    return stage


stage = parallelize(build_stage(args, rank, num_stages, device))  # this rank's layers only, its slice of them
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


def parameter_bytes(rank):
    """The theory of rank's parameter bytes: 1/t of each block's weight and column-parallel bias; whole, a
    row-parallel block's bias and the head (rank: a rank of the world)."""
    place = rank // num_shards % num_stages  # its stage's index
    blocks, columns, hidden = args.blocks[place], (args.blocks[place] + 1) // 2, args.hidden
    numbers = (blocks * hidden + columns) * hidden // num_shards + (blocks - columns) * hidden
    numbers += (place == num_stages - 1) * (hidden + 1) * args.classes  # the head, on every shard of the last stage
    return numbers * next(stage.parameters()).element_size()  # bytes a number, in the run's dtype


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
    log_step(step, loss if copy == num_copies - 1 and shard == num_shards - 1 else None)  # once a step, the last rank
# rank: a rank of the world, whose stage is rank // t % num_stages
report(args, [stage], expected_inflight=lambda rank: one_f_one_b_inflight(num_stages, args.micro_batches,
                                                                         rank // num_shards % num_stages),
       bubble_theory=gpipe_bubble(num_stages, args.micro_batches), expected_parameter_bytes=parameter_bytes)
finish()
