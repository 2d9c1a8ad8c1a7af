"""ZB-V (Qi et al., NeurIPS 2024; PyTorch's ScheduleZBVZeroBubble): zero bubble's I and W on two model
chunks per rank, placed as a V: rank r holds stages r and 2n - 1 - r, so the loss sits on rank 0.

    torchrun --nproc_per_node=4 06_zbv.py

At one unit per F, I and W the bubble is (n - 1) / (6m + n - 1) (m >= (3n - 1) / 2), half of ZB-H1's; rank
r keeps min(2n - r - 1, m) + min(r + 1, m) half-stage chunks in flight. f3: micro-batch 3 in chunk 1 (n = 3, m = 5).

    rank 0  F0 F1 F2 F3 F4 f0 i0 w0 f1 i1 w1 f2 i2 w2 I0 W0 f3 i3 w3 I1 W1 f4 i4 w4 I2 W2 I3 W3 I4 W4
    rank 1     F0 F1 F2 f0 F3 f1 i0 w0 f2 i1 w1 F4 I0 W0 f3 i2 w2 I1 W1 f4 i3 w3 I2 i4 I3 W2 I4 W3 w4 W4
    rank 2        F0 f0 F1 f1 F2 f2 i0 w0 F3 I0 W0 f3 i1 w1 F4 I1 W1 f4 i2 w2 I2 i3 I3 i4 I4 W2 w3 w4 W3 W4
"""

import torch
import torch.nn.functional as F

from common import (
    Recv,
    Send,
    build_stage,
    finish,
    get_batch,
    parse_args,
    post,
    release,
    setup,
    timetable,
    wait_for_sends,
)
from harness import log_step, record, report, timed_step, track
from theory import zbv_bubble, zbv_inflight

args = parse_args(__doc__, "micro_batches", virtual_stages=2, schedule="zbv")  # the V: two chunks a rank
rank, num_ranks, device = setup(args, placement="v")
# this rank's layers only: chunk 0 is stage rank, chunk 1 stage 2n - 1 - rank, the V's two arms
stages = [build_stage(args, stage, 2 * num_ranks, device) for stage in (rank, 2 * num_ranks - 1 - rank)]
optimizer = torch.optim.Adam([param for stage in stages for param in stage.parameters()], lr=args.lr, fused=True)
noted = []  # (Linear, its input, its output's gradient edge) for each Linear the forward has run


def note(linear, inputs, output):
    """Forward hook: W will need the input (detached: kept past I, it must not keep the graph alive), held from
    now on; I stops at the output and hands W its gradient. Under no_grad (--recompute's F) nothing to note."""
    if torch.is_grad_enabled():
        noted.append((linear, track(inputs[0].detach()), torch.autograd.graph.get_gradient_edge(output)))


for module in (module for stage in stages for module in stage.modules()):
    if isinstance(module, torch.nn.Linear):
        module.register_forward_hook(note)


def forward_pass(stage, input_tensor, inputs, labels):
    """This stage's forward; on the last stage, the loss."""
    output_tensor = stage(inputs if stage.is_first else input_tensor)
    if stage.is_last:
        # sum / batch_size is this micro-batch's share of the batch mean: the shares add up to it
        output_tensor = F.cross_entropy(output_tensor, labels, reduction="sum") / args.batch_size
    return output_tensor


def forward_step(micro_batch, chunk, input_tensor, inputs, labels):
    """The timed forward. With --recompute it runs under no_grad: it saves nothing, and I runs it again."""
    stage = stages[chunk]
    with record("forward", micro_batch, chunk), torch.set_grad_enabled(not args.recompute):
        return forward_pass(stage, input_tensor, inputs, labels)


def input_grad_step(micro_batch, input_tensor, output_tensor, grad_output, linears, inputs, labels, chunk=0):
    """I: backpropagate to this stage's input and to each Linear's output, not to the weights;
    return the gradient for the previous stage, and what W needs."""
    stage = stages[chunk]
    with record("backward", micro_batch, chunk):
        if args.recompute:  # the forward again, from the stage's input: its activations live for this I only
            output_tensor = forward_pass(stage, input_tensor, inputs, labels)
            linears = noted.copy()  # and W's inputs with it, not kept from F: they would keep every activation
            noted.clear()
        edges = [edge for _, _, edge in linears] + ([] if input_tensor is None else [input_tensor])
        grads = torch.autograd.grad(output_tensor, edges, grad_outputs=grad_output)  # grad_output is None for the loss
    # what W needs: each Linear's input, held since the hook noted it, and its output's gradient, held from now on
    weight_work = [(linear, x, track(grad)) for (linear, x, _), grad in zip(linears, grads)]
    return (None if input_tensor is None else grads[-1]), weight_work


def weight_step(micro_batch, weight_work, chunk=0):
    """W: each Linear's weight and bias gradients, one matrix product each, added into .grad."""
    with record("weight", micro_batch, chunk):
        for linear, linear_input, grad_linear_output in weight_work:
            if linear.weight.grad is None:  # zero_grad() leaves None
                linear.weight.grad, linear.bias.grad = torch.zeros_like(linear.weight), torch.zeros_like(linear.bias)
            linear.weight.grad.addmm_(grad_linear_output.T, linear_input)
            linear.bias.grad += grad_linear_output.sum(0)


def get_schedule(rank):
    """Rank's computations in order, (kind, chunk, micro_batch): PyTorch's ZB-V rule. Each chunk runs its
    micro-batches in order. The rule needs 2n - 1 micro-batches; with fewer, those past m are left out."""
    F0, I0, W0, F1, I1, W1 = [(kind, chunk) for chunk in (0, 1) for kind in ("forward", "backward", "weight")]
    num_microbatches = max(args.micro_batches, 2 * num_ranks - 1)
    # Warm-up: chunk 0's forwards until micro-batch 0 is back up at chunk 1, then both in turn, then chunk 1's.
    order = [F0] * (2 * (num_ranks - rank) - 1) + [F1, F0] * rank + [F1, I1, W1] * (num_ranks - rank)
    # Steady state: F, I and W on chunk 0, then on chunk 1, until chunk 1 has caught up.
    while order.count(F1) < order.count(F0) or order.count(F0) < num_microbatches:
        order += [F0] * (order.count(F0) < num_microbatches) + [I0, W0, F1, I1, W1]
    # Cool-down: the I's left, W's deferred into the slots where the pipeline drains.
    order += [I0, I1] * rank + [I0, W0] * (num_ranks - rank)
    order += [W1] * (order.count(I1) - order.count(W1)) + [W0] * (order.count(I0) - order.count(W0))
    schedule = [(kind, chunk, order[:k].count((kind, chunk))) for k, (kind, chunk) in enumerate(order)]
    return [(kind, chunk, i) for kind, chunk, i in schedule if i < args.micro_batches]


def train_step(inputs, labels):
    """The rule's order, each tensor sent the moment it is made and waited for when it is used."""
    micro_batches = list(zip(inputs.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
    shapes = [micro_inputs.shape for micro_inputs, _ in micro_batches]  # what each receive expects
    input_tensors, output_tensors, losses = [[], []], [[], []], []  # per chunk, stashed for I, oldest first
    linear_notes, weight_works = [[], []], [[], []]  # per chunk, stashed for I, then for W, oldest first

    def forward(chunk, i, input_tensor):
        output_tensor = forward_step(i, chunk, input_tensor, *micro_batches[i])
        input_tensors[chunk].append(input_tensor)
        output_tensors[chunk].append(None if args.recompute else output_tensor)  # --recompute: I makes it again
        linear_notes[chunk].append(noted.copy())  # what the hooks noted during this forward
        noted.clear()
        if stages[chunk].is_last:
            losses.append(output_tensor.detach())
        return output_tensor

    def input_grad(chunk, i, grad_output):
        grad_input, weight_work = input_grad_step(i, input_tensors[chunk].pop(0), output_tensors[chunk].pop(0),
                                                  grad_output, linear_notes[chunk].pop(0), *micro_batches[i], chunk)
        weight_works[chunk].append((i, weight_work, chunk))
        return grad_input

    # A tensor is sent and received in one group, by both ranks, the moment it is made when every computation
    # takes one unit: all ranks post in the same order of time, so under NCCL's rules none waits for a later group.
    result, waiting = None, {}  # the last computation's result; Recv -> the group it was posted in
    for moment in timetable([get_schedule(other) for other in range(num_ranks)], rank, shapes):
        pending = post(*[Send(i, result, kind == "backward", chunk) for kind, chunk, i in moment.sends], *moment.recvs)
        waiting.update(dict.fromkeys(moment.recvs, pending))
        kind, chunk, i = moment.computation or (None, None, None)
        if kind == "weight":
            weight_step(*weight_works[chunk].pop(0))
        elif kind:
            recv = Recv(i, shapes[i], kind == "backward", chunk)
            group = waiting.pop(recv, None)  # None: nothing comes
            result = (forward if kind == "forward" else input_grad)(chunk, i, group and group.received(recv))
        release(*moment.releases)  # their receivers have used them: they surely have them
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return sum(losses) if stages[1].is_last else None


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    with timed_step(step):
        optimizer.zero_grad()
        loss = train_step(inputs, labels)
        optimizer.step()
    log_step(step, loss)
report(args, stages, expected_inflight=lambda rank: zbv_inflight(num_ranks, args.micro_batches, rank),
       bubble_theory=zbv_bubble(num_ranks, args.micro_batches))  # equal F, I, W; see the README
finish()
