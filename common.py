"""What the lesson needs: start-up, the MLP and its partitioner, the data, and point-to-point
helpers named by direction.

The schedules themselves (what is sent, when, and what is stashed for backward) live in the
numbered scripts. Measuring, checking and reporting live in harness.py, which a reader can skip.
"""

import datetime
import math
import os
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

import harness

NUM_CLASSES = 10

_rank, _world_size, _device, _dtype = 0, 1, torch.device("cpu"), torch.float32
_num_chunks = 1  # model chunks per rank: 1, except in the interleaved and V schedules
_placement = "loop"  # where a rank's chunks sit: chunk c of rank r is stage c n + r ("loop"), or r and 2n - 1 - r ("v")
_sync_sends = False  # --sync-sends: NCCL's rules on gloo
_mesh = None  # 07: the world as pipelines side by side, named axes "dp" (which pipeline) and "pp" (which stage)
_group = None  # the group the helpers send and receive in: this rank's pipeline (07), else the world


def setup(args, placement="loop", data_parallel=False):
    """Join the process group torchrun describes (a world of one without torchrun).

    data_parallel (07): the world is --data-parallel pipelines side by side, device_mesh() names
    the two axes, and the rank and world size returned (which the helpers use) are this rank's
    stage in its pipeline and the number of stages."""
    global _rank, _world_size, _device, _dtype, _num_chunks, _sync_sends, _placement, _mesh, _group
    harness.before_setup(args)  # cores and threads
    timeout = datetime.timedelta(seconds=args.timeout)  # bounds every wait, on every backend
    if "RANK" not in os.environ:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif torch.cuda.is_available():
        _device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(_device)
        dist.init_process_group("nccl", timeout=timeout, device_id=_device)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    _rank, _world_size, _dtype = dist.get_rank(), dist.get_world_size(), getattr(torch, args.dtype)
    _num_chunks, _sync_sends, _placement = args.virtual_stages, args.sync_sends, placement
    harness.after_setup(args, _device)  # the same flags on every rank, one clock, errors as sentences
    if data_parallel:
        # New groups wait 30 minutes by default, whatever init_process_group was given: pass --timeout on.
        options = dist.ProcessGroupNCCL.Options() if _device.type == "cuda" else dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        # Rank = copy * stages + stage: a pipeline's stages are consecutive ranks, a stage's copies
        # are a pipeline's length apart.
        _mesh = init_device_mesh(_device.type, (args.data_parallel, _world_size // args.data_parallel),
                                 mesh_dim_names=("dp", "pp"), backend_override={"dp": options, "pp": options})
        _group, _rank, _world_size = _mesh.get_group("pp"), _mesh.get_local_rank("pp"), _mesh.size(1)
    return _rank, _world_size, _device


def device_mesh():
    """The grid setup(args, data_parallel=True) built: mesh["pp"] is this rank's pipeline, mesh["dp"]
    the copies of its stage, one in each pipeline."""
    return _mesh


# ----------------------------------------------------------------------------- model


def seed_for(seed, *what):
    """A generator seed for one named thing (a layer, a step's batch), the same on every rank."""
    return zlib.crc32(repr((seed, *what)).encode())


def partition(num_layers, num_stages):
    """Contiguous, balanced stages: [(first, last), ...]; the leftover layers go to the first
    stages, since the last one also holds the head."""
    base, leftover = divmod(num_layers, num_stages)
    bounds, first = [], 0
    for stage in range(num_stages):
        last = first + base + (stage < leftover)
        bounds.append((first, last))
        first = last
    return bounds


class Stage(nn.Module):
    """Blocks first..last-1 of the MLP (Linear + ReLU each), plus the head on the last stage.

    Parameter names are the whole model's ("blocks.5.weight", "head.bias") whichever
    stage holds them, so gradients can be compared name by name with the baseline.
    """

    def __init__(self, args, first, last, has_head):
        super().__init__()
        self.is_first, self.is_last, self.layers = first == 0, has_head, (first, last)
        self.blocks = nn.ModuleDict({str(layer): nn.Linear(args.hidden, args.hidden) for layer in range(first, last)})
        self.head = nn.Linear(args.hidden, NUM_CLASSES) if has_head else None
        with torch.no_grad():
            for layer, block in self.blocks.items():
                _init_linear(block, args.seed, int(layer), gain=2.0)
            if has_head:
                _init_linear(self.head, args.seed, args.layers, gain=1.0)

    def forward(self, x):
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return self.head(x) if self.head is not None else x


def _init_linear(linear, seed, layer, gain):
    # He init (std = sqrt(gain / fan_in)) keeps a deep ReLU stack's signal from vanishing,
    # which PyTorch's default init does not; each layer has its own seed, so a rank builds
    # exactly the baseline's weights for its layers and never the others'.
    generator = torch.Generator().manual_seed(seed_for(seed, "layer", layer))
    fan_out, fan_in = linear.weight.shape
    weight = torch.randn(fan_out, fan_in, generator=generator, dtype=torch.float64) * math.sqrt(gain / fan_in)
    linear.weight.copy_(weight)
    linear.bias.zero_()


def build_stage(args, stage, num_stages, device):
    """Stage `stage` of `num_stages`, and only it, in the run's dtype on its device."""
    first, last = partition(args.layers, num_stages)[stage]
    return Stage(args, first, last, has_head=stage == num_stages - 1).to(device, getattr(torch, args.dtype))


def get_batch(args, step, device):
    """The step's batch, a function of (--seed, step) alone: noisy samples around one
    fixed centre per class, a task the MLP learns in a few dozen steps."""
    centres_generator = torch.Generator().manual_seed(seed_for(args.seed, "centres"))
    centres = torch.randn(NUM_CLASSES, args.hidden, generator=centres_generator)
    generator = torch.Generator().manual_seed(seed_for(args.seed, "batch", step))
    labels = torch.randint(NUM_CLASSES, (args.batch_size,), generator=generator)
    inputs = centres[labels] + torch.randn(args.batch_size, args.hidden, generator=generator)
    return inputs.to(device, getattr(torch, args.dtype)), labels.to(device)


# ----------------------------------------------------------------------------- point-to-point
# Named by direction, as seen from this stage; `chunk` is which of this rank's model chunks
# (stage chunk * world_size + rank; on the V, stage rank or 2 world_size - 1 - rank) sends or
# receives: always 0 but in the interleaved and V schedules. Each does nothing (and receives
# None) where the pipeline ends, so a schedule reads the same on every rank. A receive returns
# once its tensor has arrived. A send returns at once, and the stage goes on computing while
# the tensor travels; it is released (waited on, its buffer freed) as soon as this rank knows
# the peer has it, and wait_for_sends() releases the rest before the step ends. A receive is
# posted with the sends of its group, when it is needed: posted a computation earlier, it made
# no schedule here faster on gloo and 04 slower (the README measures it). The V (06) posts each
# group the moment its tensor is made, with post(), waits when it uses it, and release()s its own.

_sends = {}  # (peer, tag) -> (request, name, micro_batch, chunk): posted, not yet released
_receiving = []  # [request, name, micro_batch, chunk, peer]: receives posted, not yet waited on
_loopback = {}  # (peer, tag) -> tensor: sent from one chunk to the next on the same rank (a world of one, the V)


def recv_forward(micro_batch, shape, chunk=0):
    """The previous stage's activation for this micro-batch (None on the first stage)."""
    return communicate("recv_forward", recv_forward=(micro_batch, chunk, shape))[0]


def send_forward(micro_batch, output_tensor, chunk=0):
    """This stage's activation, to the next stage (nothing on the last)."""
    communicate("send_forward", send_forward=(micro_batch, chunk, output_tensor))


def recv_backward(micro_batch, shape, chunk=0):
    """The gradient of the loss with respect to this stage's output (None on the last stage)."""
    return communicate("recv_backward", recv_backward=(micro_batch, chunk, shape))[1]


def send_backward(micro_batch, grad_input, chunk=0):
    """The gradient with respect to this stage's input, to the previous stage (nothing on the first)."""
    communicate("send_backward", send_backward=(micro_batch, chunk, grad_input))


def send_forward_recv_backward(micro_batch, output_tensor, recv_micro_batch, shape):
    """send_forward of micro_batch and recv_backward of recv_micro_batch, posted together."""
    return communicate("send_forward_recv_backward", send_forward=(micro_batch, 0, output_tensor),
                       recv_backward=(recv_micro_batch, 0, shape))[1]


def send_backward_recv_forward(micro_batch, grad_input, recv_micro_batch, shape, meanwhile=None):
    """send_backward of micro_batch and recv_forward of recv_micro_batch, posted together;
    meanwhile(), if given, runs while they travel."""
    return communicate("send_backward_recv_forward", send_backward=(micro_batch, 0, grad_input),
                       recv_forward=(recv_micro_batch, 0, shape), meanwhile=meanwhile)[0]


def communicate(name, send_forward=None, send_backward=None, recv_forward=None, recv_backward=None, meanwhile=None):
    """Post any of the four as one group, run meanwhile() if given, wait for the receives, and
    return (input_tensor, grad_output), None where nothing was received. Each is (micro_batch,
    chunk, tensor or shape)."""
    sends = [(*send, False) for send in (send_forward,) if send] + [(*send, True) for send in (send_backward,) if send]
    recvs = [(*recv, False) for recv in (recv_forward,) if recv] + [(*recv, True) for recv in (recv_backward,) if recv]
    received = _p2p(name, sends, recvs, meanwhile)
    input_tensor, grad_output = received.get(False), received.get(True)
    if input_tensor is not None:
        input_tensor.requires_grad_()  # a leaf: backward leaves the gradient to send back in its .grad
    return input_tensor, grad_output


def post(sends=(), recvs=()):
    """Any number of sends and receives, posted as one group, without waiting: each send is
    (micro_batch, chunk, tensor, gradient?), each receive (micro_batch, chunk, shape, gradient?).
    Returns, per receive, a function that waits for its tensor and returns it (None where the
    pipeline ends; a received activation made a leaf, as communicate does). A send is held until
    release() lets go of it. Waits are named after what they are for: the forward or backward that
    uses a receive, the send."""
    pending, sent = _post(None, list(sends), list(recvs))
    for link in sent if _sync_sends else ():  # NCCL's rule: a send is done once received
        _release(link)
    return [lambda receive=receive: _take(receive) for receive in pending]


def release(micro_batch, chunk, gradient):
    """Wait until the peer has the tensor post() sent from this chunk for this micro-batch, and let go of it."""
    link = _link(micro_batch, chunk, gradient, sending=True)
    if link:
        _release(link)


def wait_for_sends():
    """Release every send still in transit: all must be received before the step ends."""
    assert not _loopback, f"received by no one: {sorted(_loopback)}"
    for link in list(_sends):
        _release(link)


def _link(micro_batch, chunk, gradient, sending):
    """(peer, tag) of the tensor this stage sends or receives, or None where the pipeline ends.

    Activations go to the next stage and gradients come back from it. The tag names the tensor:
    its micro-batch, the boundary it crosses (between stages b and b + 1) and its direction.
    gloo matches a receive to a send by peer and tag, so a receive gets only the tensor it was
    posted for, even when one peer sends two kinds (the interleaved schedule with two ranks).
    """
    last = _world_size * _num_chunks - 1
    stage = chunk * _world_size + _rank if _placement == "loop" else (_rank, last - _rank)[chunk]
    toward_next = sending != gradient
    boundary = stage if toward_next else stage - 1
    if not 0 <= boundary < last:
        return None
    tag = (micro_batch * _world_size * _num_chunks + boundary) * 2 + gradient
    neighbour = stage + 1 if toward_next else stage - 1
    # the V: stages s and 2n - 1 - s sit on one rank, so the bottom rank's chunks are neighbours (a link to itself)
    return neighbour % _world_size if _placement == "loop" else min(neighbour, last - neighbour), tag


def _operation(op, tensor, link):
    # NCCL ignores tags and matches by order alone: so does --sync-sends (every tag 0), which makes
    # a schedule that posts in the wrong order fail the gradient check on gloo too.
    return dist.P2POp(op, tensor, group=_group, group_peer=link[0], tag=0 if _sync_sends else link[1])


def _world_rank(peer):
    """A peer's rank in the world: the helpers name it by its place in this rank's pipeline."""
    return peer if _group is None else dist.get_global_rank(_group, peer)


def _p2p(name, sends, recvs, meanwhile=None):
    """Post sends and receives as one group, run meanwhile() if given, wait for the receives, and
    return {gradient?: tensor}. Each send is (micro_batch, chunk, tensor, gradient?), each receive
    (micro_batch, chunk, shape, gradient?); those that cross no boundary (the pipeline ends there)
    are dropped."""
    pending, sent = _post(name, sends, recvs)
    if meanwhile:
        meanwhile()
    received = {recv[3]: _collect(receive) for recv, receive in zip(recvs, pending) if receive}
    for link in sent:
        # NCCL's rule: a send is done once received. Otherwise, once a peer's tensor has come in
        # this group, the peer posted its receive of ours no later than it sent that one.
        if _sync_sends or any(receive and receive[1][0] == link[0] for receive in pending):
            _release(link)
    return received


def _post(name, sends, recvs):
    """Post the group; return, per receive, [receive, link, tensor, wait or None] (None where the
    pipeline ends), which _collect() waits for, and the links of the sends to other ranks.
    name: what the waits report; None names each after what it is for."""
    sends = [(send, link) for send in sends if (link := _link(send[0], send[1], send[3], sending=True))]
    links = [_link(recv[0], recv[1], recv[3], sending=False) for recv in recvs]
    if _sync_sends:  # NCCL runs a rank's sends and receives in the order posted: a receive posted
        while _receiving:  # earlier (and not yet waited on) holds all of this back
            _wait(*_receiving.pop(0))
    for send, link in sends:
        if link[0] == _rank:  # a link to itself (a world of one with chunks, the V's bottom rank): it stays here
            _loopback[link] = harness.track(send[2]).detach()
    sends = [(send, link) for send, link in sends if link[0] != _rank]
    operations = [_operation(dist.isend, harness.track(send[2]).detach(), link) for send, link in sends]
    harness.posted([(_world_rank(peer), tag) for _, (peer, tag) in sends],
                   [(_world_rank(link[0]), link[1]) for link in links if link and link[0] != _rank])
    pending = []
    for recv, link in zip(recvs, links):
        if link is None:
            pending.append(None)
        elif link[0] == _rank:
            pending.append([recv, link, _loopback.pop(link), None])
        else:
            tensor = harness.track(torch.empty(recv[2], dtype=_dtype, device=_device))
            operations.append(_operation(dist.irecv, tensor, link))
            pending.append([recv, link, tensor, len(operations) - 1])
    # One group: NCCL runs two ranks' sends and receives in order on one stream, so sends and
    # receives that must overlap are launched together (gloo's are independent anyway).
    requests = dist.batch_isend_irecv(operations) if operations else []
    for (send, link), request in zip(sends, requests):
        _sends[link] = request, name or "send", send[0], send[1]
    for receive in pending:
        if receive and receive[3] is not None:
            receive[3] = [requests[receive[3]], name or ("backward" if receive[0][3] else "forward"), receive[0][0],
                          receive[0][1], receive[1][0]]
            _receiving.append(receive[3])
    return pending, [link for _, link in sends]


def _collect(receive):
    """Wait for a posted receive, release the sends its arrival proves received, return its tensor."""
    recv, link, tensor, _ = receive
    _arrive(receive)
    if recv[3]:  # a gradient is back, so the peer surely had the activation it came from
        _release((link[0], link[1] - 1))
    else:  # an activation: its sender posted the receive of every gradient we sent it no later than this
        for sent in [sent for sent in _sends if sent[0] == link[0] and sent[1] % 2]:
            _release(sent)
    return tensor


def _arrive(receive):
    """Wait for a posted receive's tensor, unless a group posted since has waited for it."""
    wait = receive[3]
    if wait in _receiving:
        _receiving.remove(wait)
        _wait(*wait)


def _take(receive):
    """post()'s receive: the tensor, once here; a received activation becomes a leaf."""
    if receive is None:
        return None
    _arrive(receive)
    tensor, receive[2:] = receive[2], [None, None]  # from here on only the caller holds it
    return tensor if receive[0][3] else tensor.requires_grad_()


def _release(link):
    """Wait for a send and let go of it, which frees its buffer."""
    if link in _sends:
        request, name, micro_batch, chunk = _sends.pop(link)
        _wait(request, name, micro_batch, chunk, link[0])


def _wait(request, name, micro_batch, chunk, peer):
    try:
        with harness.record("wait", micro_batch, chunk):
            request.wait()  # no timeout here: on NCCL a timed wait blocks the host; --timeout bounds it
    except RuntimeError as error:
        what = f"micro-batch {micro_batch}" + (f", chunk {chunk}" if _num_chunks > 1 else "")
        peer = _world_rank(peer)
        raise harness.PipelineError(f"rank {dist.get_rank()} gave up in {name} ({what}) waiting for rank {peer} "
                                    f"({str(error).splitlines()[0]}); rank {peer} may be stuck, dead or itself "
                                    f"waiting, or just slower than --timeout") from None
