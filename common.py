"""What every script shares: flags, start-up, the MLP and its partitioner, the data,
point-to-point helpers named by direction, and the instrumentation behind the summary.

The schedules themselves (what is sent, when, and what is stashed for backward) live
in the numbered scripts.
"""

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import socket
import sys
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn

NUM_CLASSES = 10
DTYPES = {"float32": torch.float32, "float64": torch.float64}
KINDS = ("forward", "backward", "wait")  # what a recorded span can be


class PipelineError(Exception):
    """A failure explained in one sentence: printed as such, without a traceback."""


# ----------------------------------------------------------------------------- flags


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        fail(f"{message} (see --help)")


def parse_args(doc, micro_batches=False, one_process=False):
    """The flags every script takes; each mistake ends the run with one sentence."""
    parser = _Parser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16, help="hidden blocks (Linear + ReLU) before the head")
    parser.add_argument("--hidden", type=int, default=256, help="width of every block")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per optimizer step")
    if micro_batches:
        parser.add_argument("--micro-batches", type=int, default=8, help="micro-batches each batch is split into")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the data")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--threads", type=int, help="torch threads per rank (default: cores / ranks on this host)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a rank waits on another, then gives up")
    parser.add_argument("--json", action="store_true", help="print one JSON line with the run's measurements")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace (Perfetto, chrome://tracing) of the run")
    parser.add_argument("--dump-grads", metavar="DIR", help="write each rank's gradients after the first backward")
    parser.add_argument("--dump-params", metavar="DIR", help="write each rank's parameters after the last step")
    parser.add_argument("--no-instrument", action="store_true", help="skip the timing and memory hooks (their cost)")
    parser.add_argument("--overhead", action="store_true",
                        help="instrument the even steps only, and compare their time with the odd steps'")
    args = parser.parse_args()
    if not micro_batches:
        args.micro_batches = 1  # the whole batch is one micro-batch

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if args.threads is None:
        args.threads = max(1, len(os.sched_getaffinity(0)) // local_world_size)
    for flag in ("layers", "hidden", "batch_size", "steps", "threads"):
        if getattr(args, flag) < 1:
            fail(f"--{flag.replace('_', '-')} must be at least 1, not {getattr(args, flag)}.")
    for flag in ("lr", "timeout"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag} must be a positive number, not {getattr(args, flag)}.")
    if not 1 <= args.micro_batches <= args.batch_size:
        fail(f"--micro-batches must be between 1 and --batch-size ({args.batch_size}), not {args.micro_batches}.")
    if one_process and world_size > 1:
        script = os.path.basename(sys.argv[0])
        fail(f"{script} trains the whole model in one process: start it with python {script}, not torchrun.")
    if world_size > args.layers:
        fail(f"{world_size} ranks cannot share {args.layers} layers: start at most {args.layers} ranks "
             f"or pass --layers {world_size} or more.")
    if torch.cuda.is_available() and local_world_size > torch.cuda.device_count():
        fail(f"{local_world_size} ranks on this node but {torch.cuda.device_count()} GPU(s): start one rank per GPU, "
             "or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run on the CPU.")
    if args.trace and not os.path.isdir(os.path.dirname(os.path.abspath(args.trace))):
        fail(f"--trace {args.trace}: its folder does not exist.")
    if args.trace and args.no_instrument:
        fail("--trace needs the spans that --no-instrument turns off: pass one or the other.")
    if args.overhead and args.no_instrument:
        fail("--overhead needs the instrumentation that --no-instrument turns off: pass one or the other.")
    if args.overhead and args.steps < 3:
        fail(f"--overhead compares the even and odd steps after the first: pass --steps 3 or more, not {args.steps}.")
    for flag, path in (("--dump-grads", args.dump_grads), ("--dump-params", args.dump_params)):
        if path and os.path.exists(path) and not os.path.isdir(path):
            fail(f"{flag} {path}: that is a file, not a folder.")
    if "RANK" not in os.environ and not one_process:
        print(f"note: started without torchrun, so this is a world of one; for four stages run "
              f"torchrun --nproc_per_node=4 {os.path.basename(sys.argv[0])}", file=sys.stderr)
    return args


def fail(message):
    """End the run with one sentence and a non-zero exit.

    Every rank checks the same things and finds the same mistake; one rank per node
    says it. The others wait for torchrun, which stops them once that rank has exited
    (exiting first could get the speaking rank stopped before it speaks).
    """
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    else:
        time.sleep(10)
    os._exit(2)  # skip interpreter teardown: nothing to save, and no rank waits on us


# ----------------------------------------------------------------------------- start-up

_rank, _world_size, _device, _dtype, _timeout = 0, 1, torch.device("cpu"), torch.float32, 60.0
_clock_offset = 0.0  # added to time.perf_counter() to read rank 0's clock
_torch_excepthook = sys.excepthook


def setup(args):
    """Join the process group torchrun describes (a world of one without torchrun)."""
    global _rank, _world_size, _device, _dtype, _timeout, _torch_excepthook
    _pin_to_cores(args.threads)
    torch.set_num_threads(args.threads)
    _dtype, _timeout = DTYPES[args.dtype], args.timeout
    _recorder.enabled, _recorder.alternate = not args.no_instrument, args.overhead
    timeout = datetime.timedelta(seconds=args.timeout)
    if "RANK" not in os.environ:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif torch.cuda.is_available():
        _device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(_device)
        dist.init_process_group("nccl", timeout=timeout, device_id=_device)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    _rank, _world_size = dist.get_rank(), dist.get_world_size()
    _torch_excepthook, sys.excepthook = sys.excepthook, _excepthook  # after init_process_group, which sets its own
    _check_same_flags(args)
    _sync_clock()
    return _rank, _world_size, _device


def _pin_to_cores(threads):
    """Give each rank on this host its own cores, so ranks do not take turns on the same ones."""
    cores = sorted(os.sched_getaffinity(0))
    local_rank, local_world_size = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if local_world_size * threads <= len(cores):
        os.sched_setaffinity(0, cores[local_rank * threads:(local_rank + 1) * threads])


def _check_same_flags(args):
    """Ranks launched by hand on several nodes can disagree on a flag: compare with rank 0."""
    flags = [name for name in sorted(vars(args)) if name not in ("threads", "json", "trace")]
    mine = torch.tensor([zlib.crc32(repr(getattr(args, name)).encode()) for name in flags], device=_device)
    everyone = [torch.empty_like(mine) for _ in range(_world_size)]
    dist.all_gather(everyone, mine)
    differing = []
    for index, name in enumerate(flags):
        ranks = [rank for rank, theirs in enumerate(everyone) if theirs[index] != everyone[0][index]]
        if ranks:
            differing.append(f"--{name.replace('_', '-')} on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}")
    if differing:
        fail(f"ranks were started with flags that differ from rank 0's ({'; '.join(differing)}): "
             "start every rank with the same flags.")


def _sync_clock():
    """Put every rank on rank 0's clock. time.perf_counter() is one clock for every process on a
    machine, so ranks on rank 0's machine read it already. A rank on another machine measures its
    offset with a ping-pong and keeps the estimate from the fastest round trip: wrong by at most
    half of it."""
    global _clock_offset
    machine = torch.tensor([zlib.crc32(_machine_id().encode())], device=_device)
    machines = [torch.empty_like(machine) for _ in range(_world_size)]
    dist.all_gather(machines, machine)
    buffer = torch.zeros(1, dtype=torch.float64, device=_device)
    for peer in range(1, _world_size):
        if machines[peer] == machines[0]:
            continue
        if _rank == 0:
            best_round_trip = math.inf
            for _ in range(8):
                sent = time.perf_counter()
                dist.send(buffer, peer)
                dist.recv(buffer, peer)
                received = _synchronized_now()
                if received - sent < best_round_trip:
                    best_round_trip, offset = received - sent, (sent + received) / 2 - buffer.item()
            dist.send(buffer.fill_(offset), peer)
        elif _rank == peer:
            for _ in range(8):
                dist.recv(buffer, 0)
                buffer.fill_(_synchronized_now())
                dist.send(buffer, 0)
            dist.recv(buffer, 0)
            _clock_offset = buffer.item()


def _machine_id():
    """The host name and, on Linux, the boot id the kernel draws at random when it starts."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot_id = file.read().strip()
    except OSError:
        boot_id = ""
    return f"{socket.gethostname()} {boot_id}"


def _synchronized_now():
    if _device.type == "cuda":
        torch.cuda.synchronize(_device)
    return time.perf_counter()


def _now():
    return _synchronized_now() + _clock_offset


def _excepthook(kind, error, traceback):
    """A PipelineError is one sentence; anything else is a bug, shown with torch's [rankN] traceback."""
    if issubclass(kind, PipelineError):
        print(f"error: {error}", file=sys.__stderr__, flush=True)
        os._exit(1)
    if issubclass(kind, KeyboardInterrupt):
        os._exit(130)
    _torch_excepthook(kind, error, traceback)


def finish():
    """Leave once every rank is done, skipping the interpreter's teardown.

    Gloo's worker threads can outlive destroy_process_group (the first optimizer step
    imports torch._dynamo, which keeps a reference to the group). A worker that drops a
    finished collective's tensors after the interpreter has begun tearing down cannot take
    the GIL and aborts the process: "terminate called without an active exception".
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------- model


def seed_for(seed, *what):
    """A generator seed for one named thing (a layer, a step's batch), the same on every rank."""
    return zlib.crc32(repr((seed, *what)).encode())


def partition(num_layers, world_size):
    """Contiguous, balanced stages: [(first, last), ...]; the leftover layers go to the first
    stages, since the last one also holds the head."""
    base, leftover = divmod(num_layers, world_size)
    bounds, first = [], 0
    for stage in range(world_size):
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
        self.is_first, self.is_last = first == 0, has_head
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


def build_stage(args, rank, world_size, device):
    """This rank's stage, and only it, in the run's dtype on its device."""
    first, last = partition(args.layers, world_size)[rank]
    return Stage(args, first, last, has_head=rank == world_size - 1).to(device, DTYPES[args.dtype])


def get_batch(args, step, device):
    """The step's batch, a function of (--seed, step) alone: noisy samples around one
    fixed centre per class, a task the MLP learns in a few dozen steps."""
    centres_generator = torch.Generator().manual_seed(seed_for(args.seed, "centres"))
    centres = torch.randn(NUM_CLASSES, args.hidden, generator=centres_generator)
    generator = torch.Generator().manual_seed(seed_for(args.seed, "batch", step))
    labels = torch.randint(NUM_CLASSES, (args.batch_size,), generator=generator)
    inputs = centres[labels] + torch.randn(args.batch_size, args.hidden, generator=generator)
    return inputs.to(device, DTYPES[args.dtype]), labels.to(device)


def dump(directory, tensors):
    """Write {name: tensor} to directory/rank{R}.pt (nothing without the flag)."""
    if directory:
        os.makedirs(directory, exist_ok=True)
        tensors = {name: tensor.detach().cpu() for name, tensor in tensors.items()}
        torch.save(tensors, os.path.join(directory, f"rank{_rank}.pt"))


# ----------------------------------------------------------------------------- point-to-point
# Named by direction, as seen from this stage. Each does nothing (and receives None) where
# the pipeline ends, so a schedule reads the same on every rank. A receive returns once its
# tensor has arrived. A send returns at once, and the stage goes on computing while it
# travels; wait_for_sends() waits for every send before the step ends. A receive can also be
# posted ahead of need (post_recv_forward, post_recv_backward), so that its tensor arrives
# while the stage computes.

_pending_sends = []  # [request, name, micro_batch, peer]: posted, not yet seen received
_posted_recvs = {}  # (peer, micro_batch) -> (request, tensor): receives posted ahead of need


def recv_forward(micro_batch, shape):
    """The previous stage's activation for this micro-batch (None on the first stage)."""
    if _rank == 0:
        return None
    received = _p2p("recv_forward", micro_batch, _rank - 1, recv_shape=shape)
    return received.requires_grad_()  # a leaf: backward leaves the gradient to send back in its .grad


def send_forward(micro_batch, output_tensor):
    """This stage's activation, to the next stage (nothing on the last)."""
    if _rank < _world_size - 1:
        _p2p("send_forward", micro_batch, _rank + 1, send=output_tensor)


def recv_backward(micro_batch, shape):
    """The gradient of the loss with respect to this stage's output (None on the last stage)."""
    if _rank == _world_size - 1:
        return None
    return _p2p("recv_backward", micro_batch, _rank + 1, recv_shape=shape)


def send_backward(micro_batch, grad_input):
    """The gradient with respect to this stage's input, to the previous stage (nothing on the first)."""
    if _rank > 0:
        _p2p("send_backward", micro_batch, _rank - 1, send=grad_input)


def send_forward_recv_backward(micro_batch, output_tensor, shape):
    """send_forward, and recv_backward of micro_batch, posted together."""
    if _rank == _world_size - 1:
        return None
    return _p2p("send_forward_recv_backward", micro_batch, _rank + 1, send=output_tensor, recv_shape=shape)


def send_backward_recv_forward(micro_batch, grad_input, shape):
    """send_backward, and recv_forward of micro_batch, posted together."""
    if _rank == 0:
        return None
    received = _p2p("send_backward_recv_forward", micro_batch, _rank - 1, send=grad_input, recv_shape=shape)
    return received.requires_grad_()


def post_recv_forward(micro_batch, shapes):
    """Post recv_forward of micro_batch now (if the step has one), to be picked up later."""
    if _rank > 0 and micro_batch < len(shapes):
        _post_recv(_rank - 1, micro_batch, shapes[micro_batch])


def post_recv_backward(micro_batch, shapes):
    """Post recv_backward of micro_batch now (if the step has one), to be picked up later."""
    if _rank < _world_size - 1 and 0 <= micro_batch < len(shapes):
        _post_recv(_rank + 1, micro_batch, shapes[micro_batch])


def _post_recv(peer, micro_batch, shape):
    # A gloo send moves no data until the receive is posted. Posted late, the receive waits
    # for the sender's gloo thread, which must first get a turn on a core busy computing.
    # NCCL runs a pair's receives and sends as kernels in order on one stream, where an early
    # receive would hold back this rank's sends: there, receives are posted when needed.
    if _device.type != "cuda":
        tensor = torch.empty(shape, dtype=_dtype, device=_device)
        _posted_recvs[peer, micro_batch] = dist.irecv(tensor, peer), tensor


def wait_for_sends():
    """Wait until every send this rank posted has been received."""
    assert not _posted_recvs, f"receives posted ahead and never used: {sorted(_posted_recvs)}"
    for request, name, micro_batch, peer in _pending_sends:
        with record("wait", micro_batch) if not request.is_completed() else contextlib.nullcontext():
            _wait(request, name, micro_batch, peer)
    _pending_sends.clear()


def _p2p(name, micro_batch, peer, send=None, recv_shape=None):
    operations, request, received = [], None, None
    if send is not None:
        operations.append((dist.isend, send.detach()))
    if recv_shape is not None:
        request, received = _posted_recvs.pop((peer, micro_batch), (None, None))
        if request is None:  # not posted ahead: post it now, with the send
            received = torch.empty(recv_shape, dtype=_dtype, device=_device)
            operations.append((dist.irecv, received))
    if operations:
        # One group: NCCL runs two ranks' sends and receives in order on one stream, so a send
        # and a receive that must overlap are launched together (gloo's are independent anyway).
        requests = dist.batch_isend_irecv([dist.P2POp(op, tensor, peer) for op, tensor in operations])
        request = request or requests[-1]  # a receive posted now is the group's last operation
    if send is not None:
        for pending in [pending for pending in _pending_sends if pending[0].is_completed()]:
            _wait(*pending)  # already received: waiting costs nothing and frees the tensor
            _pending_sends.remove(pending)
        _pending_sends.append([requests[0], name, micro_batch, peer])
    if received is not None:
        with record("wait", micro_batch):
            _wait(request, name, micro_batch, peer)
    return received


def _wait(request, name, micro_batch, peer):
    try:
        request.wait(datetime.timedelta(seconds=_timeout))
    except RuntimeError as error:
        raise PipelineError(f"rank {_rank} gave up in {name} (micro-batch {micro_batch}) waiting for rank {peer} "
                            f"({str(error).splitlines()[0]}); rank {peer} may be stuck, dead or itself waiting, "
                            f"or just slower than --timeout") from None


# ----------------------------------------------------------------------------- instrumentation
# One line at each call site: `with record("forward", i):`, `with timed_step(step):`.
# Spans are kept as rows [step, kind, micro_batch, start, end] on rank 0's clock.


class _Recorder:
    def __init__(self):
        self.enabled = True
        self.alternate = False  # --overhead: instrument the even steps only
        self.step = 0
        self.spans = []  # [step, kind, micro_batch, start, end]
        self.steps = []  # [step, start, end]
        self.losses = []
        self.saved = {}  # (address, bytes) -> how many saved tensors hold it
        self.live_bytes = self.peak_bytes = 0

    def pack(self, tensor):
        # A Linear saves its weight as a transposed view: parameters are not activations.
        if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
            return tensor
        return _Saved(self, tensor)

    @staticmethod
    def unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved


class _Saved:
    """One tensor autograd keeps for backward; counted while it lives. Each (address, size)
    counts once: ReLU's output is also the next Linear's saved input. Micro-batches cut from
    one batch share a storage, so count the bytes the tensor spans, not its storage."""

    def __init__(self, recorder, tensor):
        self.recorder, self.tensor = recorder, tensor
        self.key = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        if recorder.saved.get(self.key, 0) == 0:
            recorder.live_bytes += self.key[1]
            recorder.peak_bytes = max(recorder.peak_bytes, recorder.live_bytes)
        recorder.saved[self.key] = recorder.saved.get(self.key, 0) + 1

    def __del__(self):
        self.recorder.saved[self.key] -= 1
        if self.recorder.saved[self.key] == 0:
            del self.recorder.saved[self.key]
            self.recorder.live_bytes -= self.key[1]


_recorder = _Recorder()


@contextlib.contextmanager
def record(kind, micro_batch):
    """Time one forward, backward or wait; a forward also counts the activations it saves."""
    if not _recorder.enabled:
        yield
        return
    start = _now()
    hooks = torch.autograd.graph.saved_tensors_hooks(_recorder.pack, _recorder.unpack)
    with hooks if kind == "forward" else contextlib.nullcontext():
        yield
    _recorder.spans.append([_recorder.step, KINDS.index(kind), micro_batch, start, _now()])


@contextlib.contextmanager
def timed_step(step):
    """Time one optimizer step (spans recorded inside it carry its number)."""
    _recorder.step = step
    if _recorder.alternate:
        _recorder.enabled = step % 2 == 0
    start = _now()
    yield
    _recorder.steps.append([step, start, _now()])


def log_step(step, loss):
    """Print the step's loss where it lives, on the last stage, and keep it for the summary."""
    if loss is not None:
        _recorder.losses.append(loss.item())
        step_ms = 1e3 * (_recorder.steps[-1][2] - _recorder.steps[-1][1])
        print(f"step {step:4d} | loss {loss.item():.4f} | {step_ms:7.1f} ms", flush=True)


def report(args, expected_inflight):
    """Gather every rank's measurements on rank 0, print the timeline, the table and the JSON
    line, and end the run.

    expected_inflight(rank): how many micro-batches the schedule keeps alive on that rank.
    """
    memory = [_recorder.peak_bytes, torch.cuda.max_memory_allocated(_device) if _device.type == "cuda" else -1]
    spans, steps, losses, memory = (_gather(rows, width) for rows, width in (
        (_recorder.spans, 5), (_recorder.steps, 3), ([[loss] for loss in _recorder.losses], 1), ([memory], 2)))
    if _rank == 0:
        summary = _summarize(args, spans, steps, losses[-1][:, 0].tolist(), memory, expected_inflight)
        if not args.no_instrument:
            print(_timeline(spans))
            print(_table(summary))
        else:
            print(f"step time (median) {summary['step_ms_median']:.1f} ms")
        if args.trace:
            _write_trace(args.trace, spans)
        if args.json:
            print(json.dumps(summary), flush=True)
    finish()


def _gather(rows, width):
    """Every rank's rows (lists of `width` numbers) on every rank, as float64 tensors; counts may differ."""
    mine = torch.tensor(rows, dtype=torch.float64, device=_device).reshape(len(rows), width)
    lengths = [torch.zeros(1, dtype=torch.int64, device=_device) for _ in range(_world_size)]
    dist.all_gather(lengths, torch.tensor([len(rows)], device=_device))
    longest = max(int(length) for length in lengths)
    padded = torch.zeros(longest, width, dtype=torch.float64, device=_device)
    padded[: len(rows)] = mine
    everyone = [torch.empty_like(padded) for _ in range(_world_size)]
    dist.all_gather(everyone, padded)
    return [theirs[: int(length)].cpu() for theirs, length in zip(everyone, lengths)]


def _summarize(args, spans, steps, losses, memory, expected_inflight):
    n, m = _world_size, args.micro_batches
    # The first step pays for warm-up (allocations, thread pools); measure the rest.
    timed = list(range(1, args.steps)) if args.steps > 1 else [0]
    step_ms = {step: 1e3 * (max(float(s[step, 2]) for s in steps) - min(float(s[step, 1]) for s in steps))
               for step in timed}
    measured = [step for step in timed if not args.overhead or step % 2 == 0]  # the instrumented ones
    summary = {
        "script": os.path.basename(sys.argv[0]), "world_size": n, "num_microbatches": m,
        "batch_size": args.batch_size, "layers": args.layers, "hidden": args.hidden, "dtype": args.dtype,
        "steps": args.steps, "threads": args.threads, "losses": losses,
        "step_ms_median": _median([step_ms[step] for step in measured]),
        "bubble_theory": (n - 1) / (m + n - 1),
    }
    if args.overhead:
        summary["step_ms_median_bare"] = _median([step_ms[step] for step in timed if step % 2])
    if args.no_instrument:
        return summary
    compute, windows, inflight = [0.0] * n, 0.0, [0] * n
    for step in measured:
        rows = [s[s[:, 0] == step] for s in spans]
        work = [r[r[:, 1] < 2] for r in rows]  # forwards and backwards
        # The bubble is measured against the pipeline's own span: from the first forward
        # anywhere to the last backward anywhere. Blocked in a receive counts as idle.
        window = max(float(w[:, 4].max()) for w in work) - min(float(w[:, 3].min()) for w in work)
        windows += window
        for rank, w in enumerate(work):
            compute[rank] += float((w[:, 4] - w[:, 3]).sum())
            inflight[rank] = max(inflight[rank], _peak_inflight(w))
    idle = [windows - c for c in compute]
    summary.update({
        "bubble_measured": sum(idle) / windows / n,
        "bubble_per_rank": [i / windows for i in idle],
        "compute_ms": [1e3 * c / len(measured) for c in compute],
        "idle_ms": [1e3 * i / len(measured) for i in idle],
        "peak_inflight_microbatches": inflight,
        "expected_inflight_microbatches": [expected_inflight(rank) for rank in range(n)],
        "peak_activation_bytes": [int(rank[0, 0]) for rank in memory],
        "stage_layers": [list(bounds) for bounds in partition(args.layers, n)],
    })
    if _device.type == "cuda":
        summary["cuda_max_memory_allocated"] = [int(rank[0, 1]) for rank in memory]
    return summary


def _peak_inflight(work):
    """Most micro-batches between the start of their forward and the end of their backward."""
    events = sorted([(float(start), 1) for kind, start in work[:, [1, 3]].tolist() if kind == 0] +
                    [(float(end), -1) for kind, end in work[:, [1, 4]].tolist() if kind == 1])
    alive = peak = 0
    for _, change in events:
        alive += change
        peak = max(peak, alive)
    return peak


def _timeline(spans):
    """The last recorded step as text: a row per rank, time left to right, idle left blank."""
    step = int(spans[0][-1, 0])
    rows = [s[(s[:, 0] == step) & (s[:, 1] < 2)] for s in spans]
    start = min(float(r[:, 3].min()) for r in rows)
    length = max(float(r[:, 4].max()) for r in rows) - start
    width = max(40, shutil.get_terminal_size().columns - 10)
    lines = [f"timeline of step {step} ({1e3 * length:.1f} ms; F forward, B backward, blank idle):"]
    for rank, r in enumerate(rows):
        line, taken = [" "] * width, 0
        for _, kind, micro_batch, begin, end in sorted(r.tolist(), key=lambda span: span[3]):
            first = max(taken, int((begin - start) / length * width))  # never draw over the previous span
            last = taken = min(width, max(first + 1, round((end - start) / length * width)))
            text = ("F" if kind == 0 else "B") + str(int(micro_batch))
            text = (text + ("-" if kind == 0 else "=") * width)[: last - first]
            line[first:last] = text
        lines.append(f"rank {rank:2d} |{''.join(line).rstrip()}")
    return "\n".join(lines)


def _median(values):
    return sorted(values)[len(values) // 2]


def _table(summary):
    header = ("rank", "layers", "compute ms", "idle ms", "bubble", "theory", "in flight", "theory", "activations")
    lines = [" ".join(f"{h:>11}" for h in header)]
    for rank in range(summary["world_size"]):
        first, last = summary["stage_layers"][rank]
        lines.append(" ".join(f"{v:>11}" for v in (
            rank, f"{first}-{last - 1}", f"{summary['compute_ms'][rank]:.1f}", f"{summary['idle_ms'][rank]:.1f}",
            f"{summary['bubble_per_rank'][rank]:.3f}", f"{summary['bubble_theory']:.3f}",
            summary["peak_inflight_microbatches"][rank], summary["expected_inflight_microbatches"][rank],
            _bytes(summary["peak_activation_bytes"][rank]))))
    if "cuda_max_memory_allocated" in summary:
        lines.append("torch.cuda.max_memory_allocated per rank: " +
                     ", ".join(_bytes(b) for b in summary["cuda_max_memory_allocated"]))
    lines.append(f"step time (median) {summary['step_ms_median']:.1f} ms, bubble {summary['bubble_measured']:.3f} "
                 f"measured (mean over ranks), {summary['bubble_theory']:.3f} in theory")
    if "step_ms_median_bare" in summary:
        instrumented, bare = summary["step_ms_median"], summary["step_ms_median_bare"]
        lines.append(f"--overhead: {instrumented:.1f} ms a step instrumented (even steps), {bare:.1f} ms bare "
                     f"(odd steps), medians: {100 * (instrumented / bare - 1):+.1f}%")
    return "\n".join(lines)


def _bytes(count):
    return f"{count / 2**20:.2f} MiB"


def _write_trace(path, spans):
    """Chrome trace format: one process per rank, one complete ("X") event per span."""
    origin = min(float(s[:, 3].min()) for s in spans if len(s))
    events = []
    for rank, rows in enumerate(spans):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        for step, kind, micro_batch, start, end in rows.tolist():
            name = KINDS[int(kind)]
            events.append({"name": f"{name} {int(micro_batch)}" if name != "wait" else "wait", "cat": name, "ph": "X",
                           "pid": rank, "tid": 0, "ts": 1e6 * (start - origin), "dur": 1e6 * (end - start),
                           "args": {"step": int(step), "micro_batch": int(micro_batch)}})
    with open(path, "w") as file:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, file)
