"""Start-up and the end: cores and threads, errors as sentences, the same flags on every rank, one
clock for all, a message's measured latency; leaving cleanly, and writing tensors for the tests."""

import math
import os
import pathlib
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from harness import collectives, guarantees
from harness.flags import PipelineError, fail
from harness.meters import idle_now, recorder

_torch_excepthook = sys.excepthook


def before_setup(args):
    """Cores and threads, before the process group exists: each rank on this host gets its own cores,
    so ranks do not take turns on the same ones. Returns the flags."""
    cores, local_world_size = sorted(os.sched_getaffinity(0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if local_world_size > len(cores) and local_rank == 0:
        print(f"note: {local_world_size} ranks share {len(cores)} core{'s' * (len(cores) > 1)} on this host, so the "
              "measured bubble includes time spent waiting for a core", flush=True)
    if local_world_size * args.threads <= len(cores):
        os.sched_setaffinity(0, cores[local_rank * args.threads:(local_rank + 1) * args.threads])
    torch.set_num_threads(args.threads)
    recorder.enabled, recorder.alternate, recorder.pace = not args.no_instrument, args.overhead, args.pace / 1e3
    return args


def after_setup(args, device, named, covering, device_mesh):
    """Errors as sentences, the rules around every send and receive (named, covering: how the lesson reads a tag
    and a group's requests, common.named and common.covering), the collectives' spans (device_mesh: 07's and 08's
    mesh, common.device_mesh), the first step's gradients kept for --dump-grads, the same flags on every rank, one
    clock for all, and a message's latency."""
    global _torch_excepthook, _device_mesh
    _torch_excepthook, sys.excepthook = sys.excepthook, _excepthook  # after init_process_group, which sets its own
    recorder.device, _device_mesh = device, device_mesh
    guarantees.install(args, named, covering)
    collectives.install(device_mesh)
    if args.dump_grads:
        register_optimizer_step_pre_hook(_note_first_grads)
    _check_same_flags(args)
    _sync_clock()
    _measure_latency(args)


def _check_same_flags(args):
    """Ranks launched by hand on several nodes can disagree on a flag: compare with rank 0."""
    mine = {name: repr(value) for name, value in vars(args).items() if name not in ("threads", "json", "trace")}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    differ = {name: [rank for rank, theirs in enumerate(everyone) if theirs.get(name) != everyone[0].get(name)]
              for name in sorted(mine)}  # each flag's ranks that differ from rank 0's
    differing = [f"--{name.replace('_', '-')} on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"
                 for name, ranks in differ.items() if ranks]
    if differing:
        fail(f"ranks were started with flags that differ from rank 0's ({'; '.join(differing)}): "
             "start every rank with the same flags.")


def _sync_clock():
    """Put every rank on rank 0's clock. time.perf_counter() is one clock for every process on a
    machine, so ranks on rank 0's machine read it already. A rank on another machine asks rank 0 for
    its time, 8 times, and keeps the offset from the fastest round trip: wrong by at most half of it."""
    rank, machines = dist.get_rank(), [None] * dist.get_world_size()
    dist.all_gather_object(machines, _machine_id())
    buffer = torch.zeros(1, dtype=torch.float64, device=recorder.device)
    for peer in range(1, len(machines)):
        if machines[peer] == machines[0]:
            continue
        if rank == 0:
            for _ in range(8):
                dist.recv(buffer, peer)
                dist.send(buffer.fill_(idle_now()), peer)
        elif rank == peer:
            best_round_trip = math.inf
            for _ in range(8):
                sent = time.perf_counter()
                dist.send(buffer, 0)
                dist.recv(buffer, 0)
                received = idle_now()
                if received - sent < best_round_trip:  # rank 0 read its clock halfway, give or take
                    best_round_trip, recorder.offset = received - sent, buffer.item() - (sent + received) / 2


def _measure_latency(args, round_trips=16):
    """The one-way time of one micro-batch's activation (rows x hidden, the run's dtype) from rank 0 to the rank
    of its next stage and back (a stage's shards are neighbouring ranks): the least half round trip, after one
    that opens the connection, kept on rank 0 (recorder.latency; 0 in a pipeline of one stage)."""
    rank, peer = dist.get_rank(), args.tensor_parallel
    if dist.get_world_size() // args.data_parallel // args.tensor_parallel < 2 or rank not in (0, peer):
        return
    rows = max(1, args.batch_size // args.data_parallel // args.micro_batches)
    message = torch.zeros(rows, args.hidden, dtype=getattr(torch, args.dtype), device=recorder.device)
    halves = []
    for _ in range(round_trips + 1):
        sent = idle_now()
        if rank == 0:
            dist.send(message, peer)
            dist.recv(message, peer)
        else:
            dist.recv(message, 0)
            dist.send(message, 0)
        halves.append((idle_now() - sent) / 2)
    recorder.latency = min(halves[1:])


def _machine_id():
    """The host name and, on Linux, the boot id the kernel draws at random when it starts."""
    boot_id = pathlib.Path("/proc/sys/kernel/random/boot_id")
    return f"{socket.gethostname()} {boot_id.read_text().strip() if boot_id.exists() else ''}"


def _excepthook(kind, error, traceback):
    """A PipelineError is one sentence; anything else is a bug, shown with torch's [rankN] traceback."""
    if issubclass(kind, PipelineError):
        print(f"error: {error}", file=sys.__stderr__, flush=True)
        os._exit(1)
    if issubclass(kind, KeyboardInterrupt):
        os._exit(130)
    _torch_excepthook(kind, error, traceback)


_device_mesh = None  # common.device_mesh, for a stage's shards (08)
_first_grads = {}  # --dump-grads: each parameter's gradient as the first optimizer step found it


def _note_first_grads(optimizer, args, kwargs):
    """Before each optimizer step: the first one's gradients, kept until report writes them (dump_run)."""
    if not _first_grads:
        _first_grads.update({param: param.grad.detach().clone() for group in optimizer.param_groups
                             for param in group["params"] if param.grad is not None})


def dump_run(args, stages):
    """--dump-grads and --dump-params: the first step's gradients and the parameters now, by name, for this rank's
    stages (report calls it). 08: a stage's shards joined into the baseline's tensors, which shard 0 writes (the
    other shards an empty file)."""
    for directory, of in ((args.dump_grads, _first_grads.get), (args.dump_params, lambda param: param)):
        if directory:
            dump(directory, _whole(stages, of))


def _whole(stages, of):
    """{name: of(param)} for the stages' parameters, a shard's slice (its partition_dim, 08) joined with the
    others' in shard order; {} on all but shard 0 of a stage."""
    mesh = _device_mesh()
    shards = "tp" in mesh.mesh_dim_names if mesh is not None else False
    tensors = {}
    for stage in stages:
        for name, param in stage.named_parameters():
            tensor = of(param).detach()
            if shards and hasattr(param, "partition_dim"):
                slices = [torch.empty_like(tensor) for _ in range(mesh.size(2))]
                collectives.torch_call("all_gather")(slices, tensor.contiguous(), group=mesh.get_group("tp"))
                tensor = torch.cat(slices, param.partition_dim)
            tensors[name] = tensor
    return tensors if not shards or mesh.get_local_rank("tp") == 0 else {}


def dump(directory, tensors):
    """Write {name: tensor} to directory/rank{R}.pt (nothing without the flag)."""
    if directory:
        os.makedirs(directory, exist_ok=True)
        tensors = {name: tensor.detach().cpu() for name, tensor in tensors.items()}
        torch.save(tensors, os.path.join(directory, f"rank{dist.get_rank()}.pt"))
