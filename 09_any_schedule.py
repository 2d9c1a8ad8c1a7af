"""Any schedule from a table: one runtime for every order in schedules.py, or in a file. A schedule is a function
that returns each rank's computations, (kind, chunk, micro_batch); the loop below is 06's, on either placement.

    torchrun --nproc_per_node=4 09_any_schedule.py --schedule dualpipev --micro-batches 8
    torchrun --nproc_per_node=4 09_any_schedule.py --schedule interleaved-zero-bubble --virtual-stages 2
    python tools/plan.py --stages 4 --micro-batches 8 --costs 1,2,1 --save plan.csv  # a table found for the costs
    torchrun --nproc_per_node=4 09_any_schedule.py --schedule plan.csv --micro-batches 8

A full backward B (GPipe, 1F1B, DualPipeV) runs its I, then its W at once; the theory counts it two units. In
DualPipeV a forward and the full backward after it may be one step ([ ]): both inputs are in before it begins,
and both results leave together at its end; with --pace, --overlap R paces its parts at R of their spans, as if
the two were hidden in each other (down to the longer part's share). n = 2, m = 5, small letters chunk 1, replayed
(python tools/draw.py --schedule dualpipev --stages 2 --micro-batches 5 --full-backward-units 2):

    rank 0  F0 F1 F2 f0 i0 w0 f1[F3 b1]     [f2 B0]  [F4 b2]  [f3 B1]   b3      [f4 B2]   b4    I3 W3 I4 W4
    rank 1     F0 f0 F1 f1 F2 b0   [f2 B0]  [F3 b1]  [f3 B1]  [F4 b2]  [f4 B2]   b3    B3       i4 I4 w4 W4
"""

import os

import torch
import torch.nn.functional as F

import schedules
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
    stage_of,
    timetable,
    wait_for_sends,
)
from harness import log_step, pace_share, record, report, timed_step, track
from theory import bubbles, peak_inflight, replay, steps

args = parse_args(__doc__, "micro_batches", "virtual_stages", "schedule", virtual_stages=None)  # None: the table's own
# the table, as parse_args checked it, for torchrun's count of ranks
schedule = schedules.load(args.schedule, int(os.environ.get("WORLD_SIZE", 1)), args.micro_batches, args.virtual_stages)
args.virtual_stages = schedule.num_chunks  # 2 on the V; on the loop, 1 or --virtual-stages; a file's own
rank, num_ranks, device = setup(args, placement=schedule.placement)  # "loop" or "v", as the table places its chunks
num_chunks = args.virtual_stages
tables = schedule.tables
overlapped = {computation for step in steps(tables[rank]) if len(step) == 2 for computation in step}  # F&B steps
# this rank's layers only: chunk c is stage c n + rank ("loop"), or rank and 2n - 1 - rank ("v")
stages = [build_stage(args, stage_of(rank, chunk), num_ranks * num_chunks, device) for chunk in range(num_chunks)]
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


def train_step(inputs, labels):
    """The rule's order, each tensor sent the moment it is made and waited for when it is used."""
    micro_batches = list(zip(inputs.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
    shapes = [micro_inputs.shape for micro_inputs, _ in micro_batches]  # what each receive expects
    input_tensors, output_tensors, losses = {}, {}, []  # by (chunk, micro-batch), stashed for I
    linear_notes, weight_works = {}, {}  # by (chunk, micro-batch), stashed for I, then for W

    def forward(chunk, i, input_tensor):
        output_tensor = forward_step(i, chunk, input_tensor, *micro_batches[i])
        input_tensors[chunk, i] = input_tensor
        output_tensors[chunk, i] = None if args.recompute else output_tensor  # --recompute: I makes it again
        linear_notes[chunk, i] = noted.copy()  # what the hooks noted during this forward
        noted.clear()
        if stages[chunk].is_last:
            losses.append(output_tensor.detach())
        return output_tensor

    def input_grad(chunk, i, grad_output):
        grad_input, weight_work = input_grad_step(i, input_tensors.pop((chunk, i)), output_tensors.pop((chunk, i)),
                                                  grad_output, linear_notes.pop((chunk, i)), *micro_batches[i], chunk)
        weight_works[chunk, i] = weight_work
        return grad_input

    # A tensor is sent and received in one group, by both ranks, the moment it is made when every computation
    # takes one unit: all ranks post in the same order of time, so under NCCL's rules none waits for a later group.
    # An overlapped F&B step's two results are made at its end: they go in one group.
    spans = replay(tables, stage_of, num_ranks * num_chunks)  # each computation's, at one unit an F, I or W (a B two)
    moments = timetable(tables, rank, shapes, spans)
    sent = {computation for moment in moments for computation in moment.sends}  # those whose result travels
    results, waiting = {}, {}  # (kind, chunk, micro_batch) -> its result, held until sent; Recv -> its group
    for moment in moments:
        pending = post(*[Send(i, results.pop((kind, chunk, i)), kind != "forward", chunk)
                         for kind, chunk, i in moment.sends], *moment.recvs)
        waiting.update(dict.fromkeys(moment.recvs, pending))
        kind, chunk, i = moment.computation or (None, None, None)
        pace_share(args.overlap if (kind, chunk, i) in overlapped else 1.0)  # --pace an F&B step at --overlap
        if kind == "weight":
            weight_step(i, weight_works.pop((chunk, i)), chunk)
        elif kind:
            recv = Recv(i, shapes[i], kind != "forward", chunk)
            group = waiting.pop(recv, None)  # None: nothing comes
            result = (forward if kind == "forward" else input_grad)(chunk, i, group and group.received(recv))
            if (kind, chunk, i) in sent:
                results[kind, chunk, i] = track(result)
            if kind in ("full_backward", "overlapped_backward"):  # a B: its I, then its W at once
                weight_step(i, weight_works.pop((chunk, i)), chunk)
        release(*moment.releases)  # their receivers have used them: they surely have them
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return sum(losses) if any(stage.is_last for stage in stages) else None


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    with timed_step(step):
        optimizer.zero_grad()
        loss = train_step(inputs, labels)
        optimizer.step()
    log_step(step, loss)
# the table's own count: in flight from F to W; its replay's bubbles at --pace's spans (F, I and W one each, a full
# backward two, on a stage of average cost)
report(args, stages, expected_inflight=lambda rank: peak_inflight(tables)[rank],
       bubble_theory=lambda spans: bubbles(tables, stage_of, num_ranks * num_chunks, spans, overlap=args.overlap))
finish()
