"""Zero bubble (ZB-H1, Qi et al., ICLR 2024): 1F1B with each backward split in two. I, the
input gradient for the previous stage, which waits for it, runs at once; W, the weight gradients,
which nobody waits for, is deferred into the slots where 1F1B would sit idle.

    torchrun --nproc_per_node=4 05_zero_bubble.py

With F, I and W one unit each, a stage idles n - 1 units of 3m + n - 1 (m >= n), where 1F1B
idles 3(n - 1): the bubble is (n - 1) / (3m + n - 1). Stage r runs W r micro-batches behind I,
which keeps min(n, m) micro-batches in flight on every stage, from F to W.

    rank 0  F0 F1 F2 F3          I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7
    rank 1     F0 F1 F2       I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7
    rank 2        F0 F1    I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7
    rank 3           F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7
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
    recv_backward,
    recv_forward,
    send_backward,
    send_forward,
    send_forward_recv_backward,
    setup,
    wait_for_sends,
)
from harness import log_step, record, report, timed_step, track
from theory import zb_h1_bubble, zb_h1_inflight

args = parse_args(__doc__, "micro_batches", schedule="zb-h1")
rank, num_stages, device = setup(args)
stage = build_stage(args, rank, num_stages, device)  # this rank's layers only
optimizer = torch.optim.Adam(stage.parameters(), lr=args.lr, fused=True)
noted = []  # (Linear, its input, its output's gradient edge) for each Linear the forward has run


def note(linear, inputs, output):
    """Forward hook: W will need the input (detached: kept past I, it must not keep the graph alive), held from
    now on; I stops at the output and hands W its gradient. Under no_grad (--recompute's F) nothing to note."""
    if torch.is_grad_enabled():
        noted.append((linear, track(inputs[0].detach()), torch.autograd.graph.get_gradient_edge(output)))


for module in stage.modules():
    if isinstance(module, torch.nn.Linear):
        module.register_forward_hook(note)


def forward_pass(stage, input_tensor, inputs, labels):
    """This stage's forward; on the last stage, the loss."""
    output_tensor = stage(inputs if stage.is_first else input_tensor)
    if stage.is_last:
        # sum / batch_size is this micro-batch's share of the batch mean: the shares add up to it
        output_tensor = F.cross_entropy(output_tensor, labels, reduction="sum") / args.batch_size
    return output_tensor


def forward_step(micro_batch, input_tensor, inputs, labels):
    """The timed forward. With --recompute it runs under no_grad: it saves nothing, and I runs it again."""
    with record("forward", micro_batch), torch.set_grad_enabled(not args.recompute):
        return forward_pass(stage, input_tensor, inputs, labels)


def input_grad_step(micro_batch, input_tensor, output_tensor, grad_output, linears, inputs, labels):
    """I: backpropagate to this stage's input and to each Linear's output, not to the weights;
    return the gradient for the previous stage, and what W needs."""
    with record("backward", micro_batch):
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
    """1F1B's warm-up, steady state and cool-down, with each W run `rank` micro-batches after its I."""
    micro_batches = list(zip(inputs.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
    shapes = [micro_inputs.shape for micro_inputs, _ in micro_batches]  # what each receive expects
    input_tensors, output_tensors, losses = [], [], []  # stashed for I, oldest first
    linear_notes, weight_works = [], []  # stashed for I, then for W, oldest first

    def forward(i, input_tensor):
        output_tensor = forward_step(i, input_tensor, *micro_batches[i])
        input_tensors.append(input_tensor)
        output_tensors.append(None if args.recompute else output_tensor)  # --recompute: I makes it again
        linear_notes.append(noted.copy())  # what the hooks noted during this forward
        noted.clear()
        if stage.is_last:
            losses.append(output_tensor.detach())
        return output_tensor

    def input_grad(i, grad_output):
        grad_input, weight_work = input_grad_step(i, input_tensors.pop(0), output_tensors.pop(0), grad_output,
                                                  linear_notes.pop(0), *micro_batches[i])
        weight_works.append((i, weight_work))
        return grad_input

    def weights(keep):
        """Run the oldest deferred W's until `keep` are left."""
        while len(weight_works) > keep:
            weight_step(*weight_works.pop(0))

    # Stage r runs n - r - 1 forwards ahead of its first backward (all of them if m is smaller).
    num_warmup_microbatches = min(num_stages - rank - 1, args.micro_batches)
    num_microbatches_remaining = args.micro_batches - num_warmup_microbatches
    num_deferred_weights = rank  # W runs r behind I: stage r's I's end r slots before stage 0's, its W's fill them

    for i in range(num_warmup_microbatches):  # warm-up: forwards only
        input_tensor = recv_forward(i, shapes[i])  # None on the first stage
        send_forward(i, forward(i, input_tensor))  # nothing to send from the last stage

    if num_microbatches_remaining > 0:
        input_tensor = recv_forward(num_warmup_microbatches, shapes[num_warmup_microbatches])
    for i in range(num_microbatches_remaining):  # steady state: forward j, then I of i
        j = num_warmup_microbatches + i
        output_tensor = forward(j, input_tensor)
        # Each send is posted together with the receive the neighbour sends back. With sends
        # that wait to be received, as NCCL's do, two separate calls would deadlock: both
        # neighbours would sit in their sends, each waiting for the other to receive.
        grad_output = send_forward_recv_backward(j, output_tensor, i, shapes[i])
        grad_input = input_grad(i, grad_output)
        if j + 1 < args.micro_batches:  # W runs while the pair travels, in the wait for the next input
            pending = post(Send(i, grad_input, True), Recv(j + 1, shapes[j + 1], False))
            weights(keep=num_deferred_weights)
            input_tensor, = pending.wait()
        else:
            send_backward(i, grad_input)
            weights(keep=num_deferred_weights)

    for i in range(num_microbatches_remaining, args.micro_batches):  # cool-down: I's only
        grad_output = recv_backward(i, shapes[i])  # None on the last stage
        send_backward(i, input_grad(i, grad_output))  # nothing to send from the first stage
        weights(keep=num_deferred_weights)
    weights(keep=0)  # the W's still deferred
    wait_for_sends()  # sends return before they are received: all of them must be, before the step ends
    return sum(losses) if stage.is_last else None


for step in range(args.steps):
    inputs, labels = get_batch(args, step, device)
    with timed_step(step):
        optimizer.zero_grad()
        loss = train_step(inputs, labels)
        optimizer.step()
    log_step(step, loss)
report(args, [stage], expected_inflight=lambda rank: zb_h1_inflight(num_stages, args.micro_batches),
       bubble_theory=zb_h1_bubble(num_stages, args.micro_batches))  # equal F, I, W; see the README
finish()
