"""What the lesson needs: start-up, the MLP and its partitioner, the data, point-to-point helpers
named by direction, and the unit-time replay of a schedule.

The schedules themselves (what is sent, when, and what is stashed for backward) live in the
numbered scripts. The rules that keep the helpers' promises live in guarantees.py; measuring,
checking and reporting in harness/. A reader can skip both.
"""

import datetime
import math
import os
import zlib
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

import guarantees
import harness

NUM_CLASSES = 10

_rank, _num_ranks, _device, _dtype = 0, 1, torch.device("cpu"), torch.float32
_placement = "loop"  # where a rank's chunks sit: chunk c of rank r is stage c n + r ("loop"), or r and 2n - 1 - r ("v")
_mesh = None  # 07: the world as pipelines side by side, named axes "dp" (which pipeline) and "pp" (which stage)
_group = None  # the group the helpers send and receive in: this rank's pipeline (07), else the world


def setup(args, placement="loop", data_parallel=False):
    """Join the process group torchrun describes (a world of one without torchrun). Returns this
    rank's place in its pipeline, the number of ranks in the pipeline, and the device.

    placement: where a rank's chunks sit, chunk c of rank r being stage c n + r ("loop") or r and
    2n - 1 - r ("v"). data_parallel (07): the world is --data-parallel pipelines side by side, and
    device_mesh() names the two axes."""
    global _rank, _num_ranks, _device, _dtype, _placement, _mesh, _group
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
    _rank, _num_ranks, _dtype = dist.get_rank(), dist.get_world_size(), getattr(torch, args.dtype)
    guarantees.sync_sends, guarantees.num_chunks = args.sync_sends, args.virtual_stages
    harness.after_setup(args, _device)  # the same flags on every rank, one clock, errors as sentences
    if data_parallel:
        # New groups wait 30 minutes by default, whatever init_process_group was given: pass --timeout on.
        options = dist.ProcessGroupNCCL.Options() if _device.type == "cuda" else dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        # Rank = copy * stages + stage: a pipeline's stages are consecutive ranks, a stage's copies
        # are a pipeline's length apart.
        _mesh = init_device_mesh(_device.type, (args.data_parallel, _num_ranks // args.data_parallel),
                                 mesh_dim_names=("dp", "pp"), backend_override={"dp": options, "pp": options})
        _group, _rank, _num_ranks = _mesh.get_group("pp"), _mesh.get_local_rank("pp"), _mesh.size(1)
    _placement = placement
    return _rank, _num_ranks, _device


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
# A send or a receive names its tensor: the micro-batch, this rank's model chunk that sends or
# receives it (always 0 but in the interleaved and V schedules), and whether it is a gradient.
# post() posts any of them as one group and returns at once: the stage goes on computing while
# they travel, and pending.wait() returns the received tensors. The helpers named by direction
# are one-liners over it; where the pipeline ends they do nothing and receive None, so a schedule
# reads the same on every rank. A sent tensor is let go as soon as this rank knows the peer has
# it, and wait_for_sends() lets go of the rest before the step ends (guarantees.py).


class Send(NamedTuple):
    micro_batch: int
    tensor: torch.Tensor
    is_gradient: bool  # a gradient goes to the previous stage, an activation to the next
    chunk: int = 0


class Recv(NamedTuple):
    micro_batch: int
    shape: torch.Size
    is_gradient: bool  # a gradient comes from the next stage, an activation from the previous
    chunk: int = 0


class Link(NamedTuple):
    """Where one tensor travels: the peer (a rank of the world), the tag that names it on the wire."""
    peer: int
    tag: int
    micro_batch: int
    chunk: int
    is_gradient: bool


def recv_forward(micro_batch, shape, chunk=0):
    """The previous stage's activation for this micro-batch (None on the first stage)."""
    return post(Recv(micro_batch, shape, False, chunk)).wait()[0]


def send_forward(micro_batch, output_tensor, chunk=0):
    """This stage's activation, to the next stage (nothing on the last)."""
    post(Send(micro_batch, output_tensor, False, chunk))


def recv_backward(micro_batch, shape, chunk=0):
    """The gradient of the loss with respect to this stage's output (None on the last stage)."""
    return post(Recv(micro_batch, shape, True, chunk)).wait()[0]


def send_backward(micro_batch, grad_input, chunk=0):
    """The gradient with respect to this stage's input, to the previous stage (nothing on the first)."""
    post(Send(micro_batch, grad_input, True, chunk))


def send_forward_recv_backward(micro_batch, output_tensor, recv_micro_batch, shape):
    """send_forward of micro_batch and recv_backward of recv_micro_batch, posted together."""
    return post(Send(micro_batch, output_tensor, False), Recv(recv_micro_batch, shape, True)).wait()[0]


def send_backward_recv_forward(micro_batch, grad_input, recv_micro_batch, shape):
    """send_backward of micro_batch and recv_forward of recv_micro_batch, posted together."""
    return post(Send(micro_batch, grad_input, True), Recv(recv_micro_batch, shape, False)).wait()[0]


def post(*operations):
    """Post Sends and Recvs as one group and return at once; pending.wait() returns what was received.
    NCCL runs two ranks' sends and receives in order on one stream: those that must overlap go together."""
    guarantees.hold_back()
    messages, arrivals = [], {}  # to and from other ranks; Recv -> its Message, None where the pipeline ends
    for operation in sorted(operations, key=lambda operation: isinstance(operation, Recv)):  # sends first
        is_send = isinstance(operation, Send)
        link = _link(operation, sending=is_send)
        if link is None:
            arrivals.update({} if is_send else {operation: None})
        elif link.peer == dist.get_rank() and is_send:  # a link to itself: the tensor stays on this rank
            guarantees.keep_local(link, harness.track(operation.tensor.detach()))
        elif link.peer == dist.get_rank():
            arrivals[operation] = guarantees.Message(link, guarantees.take_local(link), is_send)
        else:
            tensor = operation.tensor.detach() if is_send else torch.empty(operation.shape, dtype=_dtype,
                                                                             device=_device)
            messages.append(guarantees.Message(link, harness.track(tensor), is_send))
            arrivals.update({} if is_send else {operation: messages[-1]})
    harness.posted([(m.link.peer, m.link.tag) for m in messages if m.is_send],
                   [(m.link.peer, m.link.tag) for m in messages if not m.is_send])
    operations = [dist.P2POp(dist.isend if message.is_send else dist.irecv, message.tensor, message.link.peer,
                             group=_group, tag=guarantees.wire_tag(message.link)) for message in messages]
    guarantees.posted(messages, dist.batch_isend_irecv(operations) if operations else [])
    guarantees.release_at_once([message.link for message in messages if message.is_send])
    return Pending(arrivals)


class Pending:
    """A posted group's receives, each waited for when its tensor is needed."""

    def __init__(self, arrivals):
        self.arrivals = arrivals  # Recv -> its Message, None where the pipeline ends

    def wait(self):
        """Every receive's tensor, in the order posted (None where the pipeline ends)."""
        return [self.received(recv) for recv in list(self.arrivals)]

    def received(self, recv):
        """Wait for one of the group's Recvs and return its tensor: from here on only the caller holds it."""
        arrival = self.arrivals.pop(recv)
        if arrival is None:
            return None
        guarantees.arrive(arrival)
        guarantees.release_on_arrival(arrival)
        # a received activation is a leaf: backward leaves the gradient to send back in its .grad
        return arrival.tensor if arrival.link.is_gradient else arrival.tensor.requires_grad_()


def release(*sends):
    """Let go of these Sends' tensors (their tensor field unused), once their peers have them (06)."""
    for send in sends:
        if link := _link(send, sending=True):
            guarantees.release(link)


def wait_for_sends():
    """Let go of every send still in transit: all must be received before the step ends."""
    guarantees.release_all()


def tag(micro_batch, boundary, is_gradient):
    """A tensor's name on the wire: its micro-batch, the boundary it crosses (between stages b and
    b + 1) and its direction. gloo matches a receive to a send by peer and tag, so a receive gets only
    the tensor it was posted for, even when one peer sends both kinds (interleaving on two ranks)."""
    return (micro_batch * _num_ranks * guarantees.num_chunks + boundary) * 2 + is_gradient


def _link(operation, sending):
    """The Link of one of this rank's Sends or Recvs, or None where the pipeline ends."""
    stage, last = stage_of(_rank, operation.chunk), _num_ranks * guarantees.num_chunks - 1
    toward_next = sending != operation.is_gradient
    boundary = stage if toward_next else stage - 1
    if not 0 <= boundary < last:
        return None
    neighbour = stage + 1 if toward_next else stage - 1
    # the V: stages s and 2n - 1 - s sit on one rank, so the bottom rank's chunks are neighbours (a link to itself)
    peer = neighbour % _num_ranks if _placement == "loop" else min(neighbour, last - neighbour)
    return Link(peer if _group is None else dist.get_global_rank(_group, peer),
                tag(operation.micro_batch, boundary, operation.is_gradient), operation.micro_batch,
                operation.chunk, operation.is_gradient)


# ----------------------------------------------------------------------------- schedule replay


def replay(schedules, stage_of, num_stages, duration=lambda kind: 1.0):
    """When each computation starts if every rank runs its schedule of (kind, chunk, micro_batch) in
    order, a computation takes duration(kind), and messages take no time: a forward waits for the
    previous stage's, a backward for the next stage's (the last stage's for its own forward), a weight
    gradient for its B. stage_of(rank, chunk) places the chunks. Returns {(stage, kind, micro_batch): start}."""
    ends, starts, clock, position = {}, {}, [0.0] * len(schedules), [0] * len(schedules)
    progress = True
    while progress:
        progress = False
        for rank, schedule in enumerate(schedules):
            while position[rank] < len(schedule):
                kind, chunk, micro_batch = schedule[position[rank]]
                stage = stage_of(rank, chunk)
                needed_kind, needed_stage = {"forward": ("forward", stage - 1),
                                             "backward": ("backward", stage + 1) if stage < num_stages - 1
                                             else ("forward", stage),
                                             "weight": ("backward", stage)}[kind]
                needed = needed_kind, micro_batch, needed_stage
                if needed_stage >= 0 and needed not in ends:
                    break  # its input is not ready yet: another rank first
                start = max(clock[rank], ends.get(needed, 0.0))
                starts[stage, kind, micro_batch] = start
                clock[rank] = ends[kind, micro_batch, stage] = start + duration(kind)
                position[rank] += 1
                progress = True
    return starts


class Moment(NamedTuple):
    """What a rank does at one moment of a replayed schedule, in this order."""
    sends: list  # (kind, chunk, micro_batch) of its computation that ends now, if its result goes to another stage
    recvs: list  # Recvs of the tensors made now for it
    computation: tuple  # (kind, chunk, micro_batch) that it starts now, or None
    releases: list  # Sends (without their tensor) of its own that their receiver uses now


def stage_of(rank, chunk):
    """The stage that chunk `chunk` of rank `rank` of this pipeline holds, as setup's placement puts it."""
    return chunk * _num_ranks + rank if _placement == "loop" else (rank, 2 * _num_ranks - 1 - rank)[chunk]


def timetable(schedules, shapes):
    """This rank's moments, in time order, when every computation takes one unit (replay): each tensor
    is sent and received the moment it is made, and let go of by its sender when its receiver uses it.
    schedules: every rank's (kind, chunk, micro_batch) in order; shapes: each micro-batch's."""
    num_stages, rank = _num_ranks * guarantees.num_chunks, _rank
    starts = replay(schedules, stage_of, num_stages)
    moments = {}
    moment = lambda time: moments.setdefault(time, Moment([], [], None, []))  # noqa: E731
    for other, schedule in enumerate(schedules):
        for kind, chunk, i in schedule:
            stage = stage_of(other, chunk)
            if other == rank:
                moments[starts[stage, kind, i]] = moment(starts[stage, kind, i])._replace(computation=(kind, chunk, i))
            target = {"forward": stage + 1, "backward": stage - 1}.get(kind, -1)  # the stage that uses its result
            if not 0 <= target < num_stages:
                continue
            is_gradient, made, used = kind == "backward", starts[stage, kind, i] + 1, starts[target, kind, i]
            if other == rank:
                moment(made).sends.append((kind, chunk, i))
                moment(used).releases.append(Send(i, None, is_gradient, chunk))
            if stage_of(rank, target_chunk := int(target >= _num_ranks)) == target:  # a stage of this rank's
                moment(made).recvs.append(Recv(i, shapes[i], is_gradient, target_chunk))
    return [moments[time] for time in sorted(moments)]
