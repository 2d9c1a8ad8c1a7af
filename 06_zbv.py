"""ZB-V (Qi et al., NeurIPS 2024; PyTorch's ScheduleZBVZeroBubble): zero bubble's B and W on two
model chunks per rank, placed as a V. Rank r holds stages r and 2n - 1 - r: a micro-batch goes
down the ranks through chunk 0 and comes back up through chunk 1, so the loss sits on rank 0.

    torchrun --nproc_per_node=4 06_zbv.py

With F, B and W of a chunk one unit each, a rank idles n - 1 units of 6m + n - 1 (m >= (3n - 1) / 2):
the bubble is (n - 1) / (6m + n - 1), about half of ZB-H1's. Rank r keeps min(2n - r - 1, m) +
min(r + 1, m) chunks in flight: 2n chunks of half a stage, 1F1B's n stages. F3/B3/W3 is micro-batch
3 in chunk 0, f3/b3/w3 in chunk 1 (n = 3, m = 5):

    rank 0  F0 F1 F2 F3 F4 f0 b0 w0 f1 b1 w1 f2 b2 w2 B0 W0 f3 b3 w3 B1 W1 f4 b4 w4 B2 W2 B3 W3 B4 W4
    rank 1     F0 F1 F2 f0 F3 f1 b0 w0 f2 b1 w1 F4 B0 W0 f3 b2 w2 B1 W1 f4 b3 w3 B2 b4 B3 W2 B4 W3 w4 W4
    rank 2        F0 f0 F1 f1 F2 f2 b0 w0 F3 B0 W0 f3 b1 w1 F4 B1 W1 f4 b2 w2 B2 b3 B3 b4 B4 W2 w3 w4 W3 W4
"""

import collections

import torch
import torch.nn.functional as F

from common import (
    build_stage,
    get_batch,
    post,
    release,
    setup,
    wait_for_sends,
)
from harness import dump, log_step, parse_args, record, replay, report, timed_step, track

args = parse_args(__doc__, micro_batches=True, v_shape=True)
rank, world_size, device = setup(args, placement="v")
num_stages = 2 * world_size
# this rank's layers only: chunk 0 is stage rank, chunk 1 stage 2n - 1 - rank, the V's two arms
stages = [build_stage(args, stage, num_stages, device) for stage in (rank, num_stages - 1 - rank)]
optimizer = torch.optim.Adam([param for stage in stages for param in stage.parameters()], lr=args.lr)
noted = []  # (Linear, its input, its output's gradient edge) for each Linear the forward has run


def note(linear, inputs, output):
    """Forward hook: W will need the input (detached: kept past B, it must not keep the graph alive);
    B stops at the output and hands W its gradient."""
    noted.append((linear, inputs[0].detach(), torch.autograd.graph.get_gradient_edge(output)))


for module in (module for stage in stages for module in stage.modules()):
    if isinstance(module, torch.nn.Linear):
        module.register_forward_hook(note)


def forward_step(micro_batch, chunk, input_tensor, inputs, labels):
    """This model chunk's forward; on the last stage, the loss."""
    stage = stages[chunk]
    with record("forward", micro_batch, chunk):
        output_tensor = stage(inputs if stage.is_first else input_tensor)
        if stage.is_last:
            # sum / batch_size is this micro-batch's share of the batch mean: the shares add up to it
            output_tensor = F.cross_entropy(output_tensor, labels, reduction="sum") / args.batch_size
    return output_tensor


def backward_step(micro_batch, chunk, input_tensor, output_tensor, grad_output, linears):
    """B: backpropagate to this chunk's input and to each Linear's output, not to the weights;
    return the gradient for the previous stage, and what W needs."""
    with record("backward", micro_batch, chunk):
        inputs = [edge for _, _, edge in linears] + ([] if input_tensor is None else [input_tensor])
        grads = torch.autograd.grad(output_tensor, inputs, grad_outputs=grad_output)  # grad_output is None for the loss
    # what W needs, counted in the held bytes: each Linear's input and its output's gradient
    weight_work = [(linear, track(x), track(grad)) for (linear, x, _), grad in zip(linears, grads)]
    return (None if input_tensor is None else grads[-1]), weight_work


def weight_step(micro_batch, chunk, weight_work):
    """W: each Linear's weight and bias gradients, one matrix product each, added into .grad."""
    with record("weight", micro_batch, chunk):
        for linear, linear_input, grad_linear_output in weight_work:
            if linear.weight.grad is None:  # zero_grad() leaves None
                linear.weight.grad, linear.bias.grad = torch.zeros_like(linear.weight), torch.zeros_like(linear.bias)
            linear.weight.grad.addmm_(grad_linear_output.T, linear_input)
            linear.bias.grad += grad_linear_output.sum(0)


def stage_of(rank, chunk):
    return (rank, num_stages - 1 - rank)[chunk]


def get_schedule(rank):
    """Rank's computations in order, (kind, chunk, micro_batch): PyTorch's ZB-V rule. Each chunk runs
    its micro-batches in order; a W runs its chunk's oldest B's weight gradients. The rule needs
    2n - 1 micro-batches; with fewer, the entries past m are holes, left out."""
    F0, B0, W0, F1, B1, W1 = [(kind, chunk) for chunk in (0, 1) for kind in ("forward", "backward", "weight")]
    done, schedule = dict.fromkeys([F0, B0, W0, F1, B1, W1], 0), []  # computations of each kind so far

    def run(*computations):
        for computation in computations:
            schedule.append((*computation, done[computation]))
            done[computation] += 1

    num_microbatches = max(args.micro_batches, 2 * world_size - 1)
    # Warm-up: chunk 0's forwards until micro-batch 0 is back up at this rank's chunk 1 (stage
    # 2n - 1 - r, 2n - 2r - 1 forwards later), then a forward of each chunk in turn while chunk 1
    # fills, then chunk 1 runs F, B and W back to back.
    num_warmup_microbatches = 2 * (world_size - rank) - 1
    run(*[F0] * num_warmup_microbatches)
    run(*[F1, F0] * rank)
    run(*[F1, B1, W1] * (world_size - rank))
    # Steady state: F, B and W on chunk 0, then on chunk 1, until chunk 1 has caught up.
    while done[F1] < done[F0] or done[F0] < num_microbatches:
        if done[F0] < num_microbatches:
            run(F0)
        run(B0, W0, F1, B1, W1)
    # Cool-down: the backwards left, W's deferred into the slots where the pipeline drains.
    run(*[B0, B1] * rank)
    run(*[B0, W0] * (world_size - rank))
    run(*[W1] * (done[B1] - done[W1]), *[W0] * (done[B0] - done[W0]))
    return [entry for entry in schedule if entry[2] < args.micro_batches]


def train_step(inputs, labels):
    """The rule's warm-up, steady state and cool-down, each tensor sent and received the moment it is
    computed when F, B and W take one unit each, and waited for when it is used."""
    micro_batches = list(zip(inputs.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
    shapes = [micro_inputs.shape for micro_inputs, _ in micro_batches]  # what each receive expects
    input_tensors, output_tensors, losses = [[], []], [[], []], []  # per chunk, stashed for backward, oldest first
    linear_notes, weight_works = [[], []], [[], []]  # per chunk, stashed for B, then for W, oldest first
    outputs = {}  # (gradient?, chunk, micro_batch) -> a computed tensor waiting for the moment it is sent

    def forward(chunk, i, input_tensor):
        output_tensor = forward_step(i, chunk, input_tensor, *micro_batches[i])
        input_tensors[chunk].append(input_tensor)
        output_tensors[chunk].append(output_tensor)
        linear_notes[chunk].append(noted.copy())  # what the hooks noted during this forward
        noted.clear()
        if stages[chunk].is_last:
            losses.append(output_tensor.detach())
        else:
            outputs[False, chunk, i] = output_tensor

    def backward(chunk, i, grad_output):
        grad_input, weight_work = backward_step(i, chunk, input_tensors[chunk].pop(0), output_tensors[chunk].pop(0),
                                                grad_output, linear_notes[chunk].pop(0))
        weight_works[chunk].append((i, chunk, weight_work))
        if grad_input is not None:
            outputs[True, chunk, i] = grad_input

    # Every rank works out every rank's schedule and when, at one unit per computation, each
    # computation starts and ends. A tensor is sent and received in one group, by both ranks, the
    # moment it is computed; its receiver waits for it when it uses it, and its sender lets go of it
    # then. All ranks post their groups in the same order of time, so under NCCL's rules (sends wait
    # to be received, receives are matched by order) none waits for a group posted later. Sending
    # whenever computed, with each receive posted when needed, is not safe: rank r runs a chunk-0
    # forward more than rank r + 1 before chunk 1's backwards, and its output would reach rank r + 1
    # ahead of gradients that rank r + 1 would post for first.
    schedules = [get_schedule(other) for other in range(world_size)]
    starts = replay(schedules, stage_of, num_stages)  # each computation's start, in units of one
    moments = collections.defaultdict(lambda: [None, [], [], []])  # time -> [computation, sends, receives, releases]
    for other, schedule in enumerate(schedules):
        for kind, chunk, i in schedule:
            stage = stage_of(other, chunk)
            if other == rank:
                moments[starts[stage, kind, i]][0] = kind, chunk, i
            target = {"forward": stage + 1, "backward": stage - 1}.get(kind, -1)  # the stage that uses its result
            if not 0 <= target < num_stages:
                continue
            gradient, made, used = kind == "backward", starts[stage, kind, i] + 1, starts[target, kind, i]
            if other == rank:
                moments[made][1].append((gradient, chunk, i))
                moments[used][3].append((gradient, chunk, i))
            if min(target, num_stages - 1 - target) == rank:
                moments[made][2].append((i, int(target >= world_size), shapes[i], gradient))

    received = {}  # (gradient?, chunk, micro_batch) -> waits for that tensor and returns it
    for time in sorted(moments):  # warm-up, steady state and cool-down, in the rule's order
        computation, sends, receives, releases = moments[time]
        sends = [(i, chunk, outputs.pop((gradient, chunk, i)), gradient) for gradient, chunk, i in sends]
        for (i, chunk, _, gradient), receive in zip(receives, post(sends, receives)):
            received[gradient, chunk, i] = receive
        kind, chunk, i = computation or (None, None, None)
        if kind == "forward":
            receive = received.pop((False, chunk, i), None)
            forward(chunk, i, receive and receive())  # None on the first stage
        elif kind == "backward":
            receive = received.pop((True, chunk, i), None)
            backward(chunk, i, receive and receive())  # None on the last stage
        elif kind == "weight":
            weight_step(*weight_works[chunk].pop(0))
        for gradient, chunk, i in releases:  # its receiver has used it: it surely has it
            release(i, chunk, gradient)
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return sum(losses) if stages[1].is_last else None


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
# in flight from F to W, at this rank's first chunk-1 backward: its chunk-0 and chunk-1 forwards so far
n, m = world_size, args.micro_batches
report(args, stages, expected_inflight=lambda rank: min(2 * n - rank - 1, m) + min(rank + 1, m),
       bubble_theory=1 - 6 * m / max(6 * m + n - 1, 4 * m + 4 * n - 2))  # equal F, B, W; see the README
