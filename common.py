"""What the lesson needs: its flags, start and end, the MLP and its partitioner, the data, point-to-point helpers named
by direction, (06) when a tensor travels. The schedules live in the scripts; measuring and checking in harness/."""

import argparse
import collections
import datetime
import math
import os
import sys
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

import harness
import theory

_rank, _num_ranks, _num_chunks, _device, _dtype, _placement = 0, 1, 1, torch.device("cpu"), torch.float32, "loop"
# 07: the world as pipelines side by side, named axes "dp" (which pipeline) and "pp" (which stage), and in 08
# "tp" (which shard of the stage); the group the helpers send and receive in, this rank's pipeline (else the world)
_mesh, _group = None, None
# The flags the lesson reads, at their defaults: every script takes those of EVERY_SCRIPT and those of the rest it
# names. harness/flags.py says what each one means, and adds the harness's own (measuring, checking).
FLAGS = dict(layers=16, hidden=1024, classes=10, batch_size=256, steps=20, lr=1e-4, seed=0, dtype="float32",
             timeout=60.0, recompute=False, micro_batches=8, virtual_stages=2, data_parallel=1, tensor_parallel=1,
             schedule="1f1b")
EVERY_SCRIPT = ("layers", "hidden", "classes", "batch_size", "steps", "lr", "seed", "dtype", "timeout", "recompute")


def parse_args(doc, *flags, **values):
    """The run's flags, --name (--batch-size for batch_size): every script's, these `flags`, the harness's; `values`
    replace defaults (06: two chunks), and a flag not taken is 1 (one micro-batch, chunk, pipeline, shard)."""
    parser = argparse.ArgumentParser(description=doc)
    parser.set_defaults(**dict(micro_batches=1, virtual_stages=1, data_parallel=1, tensor_parallel=1) | values)
    for name in EVERY_SCRIPT + flags:
        default = values.get(name, FLAGS[name])
        taking = dict(action="store_true") if default is False else dict(type=type(FLAGS[name]), default=default)
        parser.add_argument("--" + name.replace("_", "-"), **taking)
    harness.add_flags(parser)  # the harness's own flags, what each one means, and a sentence for each mistake
    return parser.parse_args()


def setup(args, placement="loop", data_parallel=False, tensor_parallel=False):
    """Join the process group torchrun describes (a world of one without torchrun); returns this rank's place in its
    pipeline, the pipeline's ranks and the device. placement: chunk c of rank r is stage c n + r ("loop"), or r and
    2n - 1 - r ("v"); data_parallel, tensor_parallel: 07's and 08's mesh (_build_mesh)."""
    global _rank, _num_ranks, _num_chunks, _device, _dtype, _placement
    timeout = datetime.timedelta(seconds=args.timeout)  # every wait's
    _dtype = getattr(torch, args.dtype)  # the run's, looked up once
    if "RANK" not in os.environ:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif torch.cuda.is_available():
        _device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(_device)
        dist.init_process_group("nccl", timeout=timeout, device_id=_device)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    _rank, _num_ranks, _num_chunks, _placement = dist.get_rank(), dist.get_world_size(), args.virtual_stages, placement
    harness.after_setup(args, _device, named, covering, device_mesh)  # the checks, the meters, one clock
    if data_parallel:
        _build_mesh(args, tensor_parallel, timeout)
    args.blocks = partition(args.layers, _num_ranks * args.virtual_stages)  # each stage's count of blocks
    harness.plan_stages(args, _rank, _num_ranks, stage_of)  # --partition's other splits, and --pace's spans
    return _rank, _num_ranks, _device


def _build_mesh(args, tensor_parallel, timeout):
    """07 and 08: the world as --data-parallel pipelines side by side, each stage --tensor-parallel shards in 08;
    this rank's place and the helpers' group become its pipeline's."""
    global _rank, _num_ranks, _mesh, _group
    # New groups wait 30 minutes by default, whatever init_process_group was given: pass --timeout on.
    options = dist.ProcessGroupNCCL.Options() if _device.type == "cuda" else dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    # Rank = (copy * stages + stage) * shards + shard: a stage's shards are neighbouring ranks, a pipeline's
    # stages are a stage's shards apart, a stage's copies a pipeline's ranks apart (07: shards = 1).
    sizes = {"dp": args.data_parallel, "pp": _num_ranks // args.data_parallel // args.tensor_parallel}
    sizes.update({"tp": args.tensor_parallel} if tensor_parallel else {})
    _mesh = init_device_mesh(_device.type, tuple(sizes.values()), mesh_dim_names=tuple(sizes),
                             backend_override=dict.fromkeys(sizes, options))
    _group, _rank, _num_ranks = _mesh.get_group("pp"), _mesh.get_local_rank("pp"), _mesh.size(1)


def finish():
    """Leave once every rank is done, without the interpreter's teardown, where gloo's threads can abort the process."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()  # stderr is written line by line
    os._exit(0)


def device_mesh():
    """The grid setup(args, data_parallel=True) built: mesh["pp"] is this rank's pipeline, mesh["dp"]
    the copies of its stage, one in each pipeline, and in 08 mesh["tp"] the shards of its stage."""
    return _mesh


# ----------------------------------------------------------------------------- model


def seed_for(seed, *what):
    """A generator seed for one named thing (a layer, a step's batch), the same on every rank."""
    return zlib.crc32(repr((seed, *what)).encode())


def partition(num_layers, num_stages):
    """Each stage's count of layers, contiguous and as equal as can be: the leftover layers go to the first
    stages, since the last one also holds the head."""
    base, leftover = divmod(num_layers, num_stages)
    return [base + (stage < leftover) for stage in range(num_stages)]


class Stage(nn.Module):
    """Blocks first..last-1 of the MLP (Linear + ReLU each), plus the head on the last stage. Parameter names are
    the whole model's ("blocks.5.weight", "head.bias") on any stage: gradients compare with the baseline's by name."""

    def __init__(self, args, first, last, has_head):
        super().__init__()
        self.is_first, self.is_last, self.layers = first == 0, has_head, (first, last)
        self.blocks = nn.ModuleDict({str(layer): nn.Linear(args.hidden, args.hidden) for layer in range(first, last)})
        self.head = nn.Linear(args.hidden, args.classes) if has_head else None
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
    # He init (std = sqrt(gain / fan_in)) keeps a deep ReLU stack's signal from vanishing, which PyTorch's default
    # does not; each layer has its own seed, so a rank builds exactly the baseline's weights for its layers alone.
    generator = torch.Generator().manual_seed(seed_for(seed, "layer", layer))
    fan_out, fan_in = linear.weight.shape
    weight = torch.randn(fan_out, fan_in, generator=generator, dtype=torch.float64) * math.sqrt(gain / fan_in)
    linear.weight.copy_(weight)
    linear.bias.zero_()


def build_stage(args, stage, num_stages, device):
    """Stage `stage` of `num_stages`, and only it, in the run's dtype on its device: its count of blocks is
    args.blocks[stage], partition's even split (setup) unless --partition says otherwise."""
    first = sum(args.blocks[:stage])
    return Stage(args, first, first + args.blocks[stage], has_head=stage == num_stages - 1).to(device, _dtype)


def get_batch(args, step, device):
    """The step's batch, a function of (--seed, step) alone: noisy samples around one fixed centre per class."""
    centres_generator = torch.Generator().manual_seed(seed_for(args.seed, "centres"))
    centres = torch.randn(args.classes, args.hidden, generator=centres_generator)
    generator = torch.Generator().manual_seed(seed_for(args.seed, "batch", step))
    labels = torch.randint(args.classes, (args.batch_size,), generator=generator)
    inputs = centres[labels] + torch.randn(args.batch_size, args.hidden, generator=generator)
    return inputs.to(device, _dtype), labels.to(device)


# ----------------------------------------------------------------------------- point-to-point
# A Send or a Recv names its tensor: the micro-batch, this rank's model chunk that sends or receives it
# (0 but in the interleaved and V schedules), and whether it is a gradient, which goes to the previous stage
# and comes from the next (an activation the other way). post() posts them as one group with PyTorch's own
# batch_isend_irecv, and the stage computes while they travel; the helpers named by direction are one-liners
# over it, and do nothing where the pipeline ends, so a schedule reads the same on every rank. The harness
# wraps torch's calls with checks (harness/guarantees.py: sends let go of once received, NCCL's rules under
# --sync-sends, a failed wait as one sentence); the lesson is right without them.
Send = collections.namedtuple("Send", "micro_batch tensor is_gradient chunk", defaults=[0])
Recv = collections.namedtuple("Recv", "micro_batch shape is_gradient chunk", defaults=[0])
_sends = {}  # (peer, tag) -> the request that covers its send, until waited for
_local = {}  # tag -> a tensor one chunk of this rank sent to the other (the V's turn on the bottom rank)


def recv_forward(micro_batch, shape, chunk=0):
    """The previous stage's activation for this micro-batch (None on the first stage), a leaf that requires grad."""
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
    """Post Sends and Recvs as one group and return at once; pending.wait() returns what was received. Each
    rank's sends and receives run in the order posted (NCCL): a send and the receive it waits on go together."""
    p2p_ops, buffers, send_index, recv_index = [], {}, {}, {}  # a Send's (peer, tag), a Recv -> its place in p2p_ops
    for op in operations:
        is_send = isinstance(op, Send)
        peer, tag = _peer_and_tag(op, is_send)  # None where the pipeline ends
        if peer is None:  # the pipeline ends here: nothing to send, and nothing comes (Pending.received gives None)
            continue
        if peer == dist.get_rank():  # this rank's other chunk (the V's bottom): gloo cannot send there
            _hand_over(op, tag, buffers)
        elif is_send:
            send_index[peer, tag] = len(p2p_ops)
            p2p_ops.append(dist.P2POp(dist.isend, op.tensor.detach(), peer, group=_group, tag=tag))
        else:
            recv_index[op] = len(p2p_ops)
            buffers[op] = torch.empty(op.shape, dtype=_dtype, device=_device)
            p2p_ops.append(dist.P2POp(dist.irecv, buffers[op], peer, group=_group, tag=tag))
    requests = dist.batch_isend_irecv(p2p_ops) if p2p_ops else []  # one an operation (gloo), or the group's (NCCL)
    requests = covering(requests, len(p2p_ops))
    _sends.update({key: requests[k] for key, k in send_index.items()})
    recvs = [op for op in operations if isinstance(op, Recv)]
    return Pending(recvs, buffers, {recv: requests[k] for recv, k in recv_index.items()})


def _hand_over(op, tag, buffers):
    """A tensor one chunk of this rank sends the other (the V's turn on the bottom rank) stays in memory (_local)."""
    if isinstance(op, Send):
        _local[tag] = harness.track(op.tensor.detach())
    else:
        buffers[op] = _local.pop(tag)  # sent earlier in this group or before


def covering(requests, count):
    """Each of a group's `count` operations' request: its own (gloo), or the one NCCL answers for the group."""
    return requests if len(requests) == count else requests * count


class Pending(collections.namedtuple("Pending", "recvs buffers requests")):
    """A group's Recvs, each waited for when needed, with each one's buffer and request (none where nothing comes)."""

    def wait(self):
        """Every receive's tensor, in the order posted (None where the pipeline ends)."""
        return [self.received(recv) for recv in self.recvs]

    def received(self, recv):
        """Wait for one of the group's Recvs and return its tensor: from here on only the caller holds it."""
        if recv in self.requests:
            self.requests.pop(recv).wait()
        tensor = self.buffers.pop(recv, None)
        if tensor is not None and not recv.is_gradient:
            tensor.requires_grad_()  # an activation: backward leaves the gradient to send back in its .grad
        return tensor


def release(*sends):
    """Wait until these Sends' peers have them (their tensor field unused), which lets go of their buffers (06)."""
    for send in sends:
        request = _sends.pop(_peer_and_tag(send, sending=True), None)
        if request is not None:
            request.wait()


def wait_for_sends():
    """Wait for every send still in transit: all must be received before the step ends."""
    assert not _local, f"received by no one: {sorted(_local)}"
    for request in _sends.values():
        request.wait()
    _sends.clear()


def stage_of(rank, chunk):
    """The stage that chunk `chunk` of rank `rank` of this pipeline holds, as setup's placement puts it."""
    return theory.stage(_placement, _num_ranks, rank, chunk)


def _peer_and_tag(operation, sending):
    """Where one of this rank's Sends or Recvs goes or comes from, a rank of the world, and its tag: the tensor's
    name on the wire, so that gloo gives a receive only its own tensor. (None, None) where the pipeline ends."""
    stage = stage_of(_rank, operation.chunk)
    last = _num_ranks * _num_chunks - 1  # the last stage
    boundary = stage if sending != operation.is_gradient else stage - 1  # toward the next stage, or the previous
    if not 0 <= boundary < last:
        return None, None
    neighbour = boundary + 1 if boundary == stage else boundary  # the stage across the boundary
    # the V: stages s and 2n - 1 - s sit on one rank, so the bottom rank's chunks are neighbours (it sends to itself)
    peer = neighbour % _num_ranks if _placement == "loop" else min(neighbour, last - neighbour)
    peer = peer if _group is None else dist.get_global_rank(_group, peer)
    return peer, (operation.micro_batch * (last + 1) + boundary) * 2 + operation.is_gradient


def named(tag, sending):
    """What one of this rank's tags names, (micro_batch, chunk, is_gradient): _peer_and_tag's tag read back, for
    the harness's spans and sentences."""
    rest, is_gradient = divmod(tag, 2)
    micro_batch, boundary = divmod(rest, _num_ranks * _num_chunks)
    stage = boundary + (sending == bool(is_gradient))  # an activation goes from stage b to b + 1, a gradient back
    chunk = next(chunk for chunk in range(_num_chunks) if stage_of(_rank, chunk) == stage)
    return micro_batch, chunk, bool(is_gradient)


# ----------------------------------------------------------------------------- when a tensor travels (06, 09)


def unit_spans(schedules):
    """When each computation of every rank's schedule of (kind, chunk, micro_batch) starts and its result is out,
    at one unit each (F, I and W: 06): once its rank's previous one is done and its input is made, a forward's by
    the previous stage, an I's by the next (a W's and the last stage's I's by its own rank, earlier). Returns
    {(kind, stage, micro_batch): (start, end)}, theory.replay's at these costs; PyTorch's runtime simulates too."""
    spans, done = {}, [0] * len(schedules)  # each rank's count of computations placed
    for time in range(sum(map(len, schedules))):  # one placed a unit at least, if the schedules can run at all
        for rank, schedule in enumerate(schedules):
            if done[rank] == len(schedule):
                continue
            kind, chunk, i = schedule[done[rank]]
            stage = stage_of(rank, chunk)
            source = {"forward": stage - 1, "backward": stage + 1}.get(kind, -1)  # the stage that makes its input
            if 0 <= source < _num_ranks * _num_chunks and spans.get((kind, source, i), (time, time + 1))[1] > time:
                continue  # its input is not made yet
            spans[kind, stage, i] = time, time + 1
            done[rank] += 1
    assert done == list(map(len, schedules)), "the schedules cannot run: a computation waits for an input never made"
    return spans


# What a rank does at one moment of a replayed schedule, in this order: it sends the results made now that go to
# another stage ((kind, chunk, micro_batch) of their computations), posts the Recvs of the tensors made now for it,
# starts a computation ((kind, chunk, micro_batch), or None), and lets go of its Sends (without their tensor) that
# their receivers use now.
Moment = collections.namedtuple("Moment", "sends recvs computation releases")


def timetable(schedules, rank, shapes, spans=None):
    """Rank's moments, in time order: each tensor is sent and received the moment it is made, and let go of by its
    sender when its receiver uses it. schedules: every rank's (kind, chunk, micro_batch) in order, its chunks placed
    as setup placed them; shapes: each micro-batch's; spans: when each computation starts and its result is out,
    {(kind, stage, micro_batch): (start, end)}, by default unit_spans's (09: theory.replay's)."""
    spans = spans or unit_spans(schedules)
    num_stages = 1 + max(stage_of(other, chunk) for other, schedule in enumerate(schedules) for _, chunk, _ in schedule)
    moments = {}
    moment = lambda time: moments.setdefault(time, Moment([], [], None, []))  # noqa: E731
    for other, schedule in enumerate(schedules):
        for kind, chunk, i in schedule:
            stage = stage_of(other, chunk)
            start, made = spans[kind, stage, i]
            if other == rank:
                moments[start] = moment(start)._replace(computation=(kind, chunk, i))
            is_gradient = kind in theory.BACKWARDS  # a backward's result goes to the previous stage
            target = stage - 1 if is_gradient else stage + 1 if kind == "forward" else -1  # the stage that uses it
            if not 0 <= target < num_stages:
                continue
            users = theory.BACKWARDS if is_gradient else ("forward",)  # what uses it on the target stage
            used = next(spans[user, target, i][0] for user in users if (user, target, i) in spans)
            if other == rank:
                moment(made).sends.append((kind, chunk, i))
                moment(used).releases.append(Send(i, None, is_gradient, chunk))
            for target_chunk in range(_num_chunks):
                if stage_of(rank, target_chunk) == target:  # a stage of this rank's
                    moment(made).recvs.append(Recv(i, shapes[i], is_gradient, target_chunk))
    return [moments[time] for time in sorted(moments)]
