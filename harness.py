"""Everything around the lesson, which a reader can skip: flags and their checks, start-up
checks, one clock for every rank, errors as sentences, the meters, and the report (timeline,
table, JSON line, Chrome trace).

The numbered scripts call it with one line at each call site: `with record("forward", i):`,
`with timed_step(step):`, `log_step(step, loss)`, `report(args, expected_inflight)`.
"""

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import sys
import threading
import time
import weakref
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn

KINDS = ("forward", "backward", "weight", "wait", "allreduce")  # what a span can be; the first three are compute
LETTERS = {"forward": "F", "backward": "B", "weight": "W"}


class PipelineError(Exception):
    """A failure explained in one sentence: printed as such, without a traceback."""


# ----------------------------------------------------------------------------- flags


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        fail(f"{message} (see --help)")


def parse_args(doc, micro_batches=False, one_process=False, virtual_stages=False, data_parallel=False, v_shape=False):
    """The flags every script takes; each mistake ends the run with one sentence. v_shape (06): two model
    chunks per rank, placed as a V, and no --virtual-stages flag."""
    parser = _Parser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16, help="hidden blocks (Linear + ReLU) before the head")
    parser.add_argument("--hidden", type=int, default=1024, help="width of every block")
    parser.add_argument("--batch-size", type=int, default=256, help="samples per optimizer step")
    if micro_batches:
        parser.add_argument("--micro-batches", type=int, default=8, help="micro-batches each batch is split into")
    if virtual_stages:
        parser.add_argument("--virtual-stages", type=int, default=2, help="model chunks per rank")
    if data_parallel:
        parser.add_argument("--data-parallel", type=int, default=1, metavar="D",
                            help="pipelines side by side, world / D stages each, their gradients summed")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the data")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--threads", type=int, help="torch threads per rank (default: cores / ranks on this host)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a rank waits on another, then gives up")
    if not one_process:
        parser.add_argument("--sync-sends", action="store_true",
                            help="NCCL's rules on gloo: a send returns once received, and tags are ignored")
    parser.add_argument("--pace", type=float, default=0.0, metavar="MS",
                        help="pad every forward, backward and weight-gradient span to MS milliseconds by sleeping, "
                             "so the timeline shows the schedule alone")
    parser.add_argument("--json", action="store_true", help="print one JSON line with the run's measurements")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace (Perfetto, chrome://tracing) of the run")
    parser.add_argument("--svg", metavar="FILE", help="draw the last step's timeline as a picture (SVG)")
    parser.add_argument("--dump-grads", metavar="DIR", help="write each rank's gradients after the first backward")
    parser.add_argument("--dump-params", metavar="DIR", help="write each rank's parameters after the last step")
    parser.add_argument("--no-instrument", action="store_true", help="skip the timing and memory hooks (their cost)")
    parser.add_argument("--overhead", action="store_true",
                        help="instrument the even steps only, and compare their time with the odd steps'")
    args = parser.parse_args()
    if not micro_batches:
        args.micro_batches = 1  # the whole batch is one micro-batch
    if not virtual_stages:
        args.virtual_stages = 2 if v_shape else 1
    if not data_parallel:
        args.data_parallel = 1
    if one_process:
        args.sync_sends = False

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if args.threads is None:
        args.threads = max(1, len(os.sched_getaffinity(0)) // local_world_size)
    for flag in ("layers", "hidden", "batch_size", "steps", "threads", "virtual_stages", "data_parallel"):
        if getattr(args, flag) < 1:
            fail(f"--{flag.replace('_', '-')} must be at least 1, not {getattr(args, flag)}.")
    for flag in ("lr", "timeout"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag} must be a positive number, not {getattr(args, flag)}.")
    if not 0 <= args.pace < 1e3 * args.timeout:
        fail(f"--pace must be between 0 (off) and --timeout in milliseconds ({1e3 * args.timeout:g}), not {args.pace}.")
    copies = args.data_parallel
    if world_size % copies:
        divisors = ", ".join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)
        fail(f"--data-parallel {copies} cannot split {world_size} rank{'s' * (world_size > 1)} into pipelines of equal "
             f"length: pass one of {divisors}, or start a multiple of {copies} ranks.")
    if args.batch_size < copies:
        fail(f"--batch-size {args.batch_size} leaves some of the {copies} pipelines without a sample: pass "
             f"--batch-size {copies} or more, or a smaller --data-parallel.")
    if copies > 1 and not 1 <= args.micro_batches <= args.batch_size // copies:
        fail(f"--micro-batches must be between 1 and the smallest pipeline's share of --batch-size "
             f"({args.batch_size // copies} of {args.batch_size} samples in {copies} pipelines), "
             f"not {args.micro_batches}.")
    if not 1 <= args.micro_batches <= args.batch_size:
        fail(f"--micro-batches must be between 1 and --batch-size ({args.batch_size}), not {args.micro_batches}.")
    if one_process and world_size > 1:
        script = os.path.basename(sys.argv[0])
        fail(f"{script} trains the whole model in one process: start it with python {script}, not torchrun.")
    num_stages = world_size // copies  # ranks in a pipeline
    if num_stages * args.virtual_stages > args.layers:
        stages = f"{world_size} rank{'s' * (world_size > 1)}" + f" in {copies} pipelines of {num_stages}" * (
            copies > 1) + f" x {args.virtual_stages} virtual stages" * (args.virtual_stages > 1)
        fail(f"{stages} cannot share {args.layers} layers: pass --layers {num_stages * args.virtual_stages} or more"
             f"{', or fewer --virtual-stages' if virtual_stages and args.virtual_stages > 1 else ''}"
             f"{', or a larger --data-parallel' if copies > 1 else ''}, or start fewer ranks.")
    if torch.cuda.is_available() and local_world_size > torch.cuda.device_count():
        fail(f"{local_world_size} ranks on this node but {torch.cuda.device_count()} GPU(s): start one rank per GPU, "
             "or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run on the CPU.")
    for flag, path in (("--trace", args.trace), ("--svg", args.svg)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            fail(f"{flag} {path}: its folder does not exist.")
        if path and args.no_instrument:
            fail(f"{flag} needs the spans that --no-instrument turns off: pass one or the other.")
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

_rank, _world_size, _device = 0, 1, torch.device("cpu")
_clock_offset = 0.0  # added to time.perf_counter() to read rank 0's clock
_torch_excepthook = sys.excepthook


def before_setup(args):
    """Cores and threads, before the process group exists."""
    cores, local_world_size = sorted(os.sched_getaffinity(0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if local_world_size > len(cores) and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        print(f"note: {local_world_size} ranks share {len(cores)} core{'s' * (len(cores) > 1)} on this host, so the "
              "measured bubble includes time spent waiting for a core", flush=True)
    _pin_to_cores(cores, args.threads)
    torch.set_num_threads(args.threads)
    _recorder.enabled, _recorder.alternate, _recorder.pace = not args.no_instrument, args.overhead, args.pace / 1e3


def after_setup(args, device):
    """Errors as sentences, the same flags on every rank, and one clock for all."""
    global _rank, _world_size, _device, _torch_excepthook
    _rank, _world_size, _device = dist.get_rank(), dist.get_world_size(), device
    _torch_excepthook, sys.excepthook = sys.excepthook, _excepthook  # after init_process_group, which sets its own
    _check_same_flags(args)
    _sync_clock()


def _pin_to_cores(cores, threads):
    """Give each rank on this host its own cores, so ranks do not take turns on the same ones."""
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
                received = _idle_now()
                if received - sent < best_round_trip:
                    best_round_trip, offset = received - sent, (sent + received) / 2 - buffer.item()
            dist.send(buffer.fill_(offset), peer)
        elif _rank == peer:
            for _ in range(8):
                dist.recv(buffer, 0)
                buffer.fill_(_idle_now())
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


def _idle_now():
    """perf_counter once this device has finished its work: only between steps, never inside one."""
    if _device.type == "cuda":
        torch.cuda.synchronize(_device)
    return time.perf_counter()


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


def dump(directory, tensors):
    """Write {name: tensor} to directory/rank{R}.pt (nothing without the flag)."""
    if directory:
        os.makedirs(directory, exist_ok=True)
        tensors = {name: tensor.detach().cpu() for name, tensor in tensors.items()}
        torch.save(tensors, os.path.join(directory, f"rank{_rank}.pt"))


# ----------------------------------------------------------------------------- meters


class _Meter:
    """Bytes held, each region of memory counted once however many tensors hold it."""

    def __init__(self):
        self.count, self.bytes, self.peak = {}, 0, 0
        self.lock = threading.RLock()  # storages are also freed on gloo's threads

    def add(self, key):
        with self.lock:
            if self.count.get(key, 0) == 0:
                self.bytes += key[1]
                self.peak = max(self.peak, self.bytes)
            self.count[key] = self.count.get(key, 0) + 1

    def remove(self, key):
        with self.lock:
            self.count[key] -= 1
            if self.count[key] == 0:
                del self.count[key]
                self.bytes -= key[1]


def _key(tensor):
    # Micro-batches cut from one batch share a storage: count the bytes a tensor spans.
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


def _is_slice(tensor):
    # A micro-batch of the data is a slice of the batch, which lives for the whole step whatever
    # the schedule: it counts while autograd (or W) keeps it, not while its memory lives.
    return tensor.untyped_storage().nbytes() > _key(tensor)[1]


class _Saved:
    """One tensor autograd keeps for backward, counted in the activation bytes while autograd keeps it."""

    def __init__(self, tensor):
        self.tensor, self.key, self.is_slice = tensor, _key(tensor), _is_slice(tensor)
        _recorder.saved.add(self.key)
        if self.is_slice:
            _recorder.held.add(self.key)
        else:
            track(tensor)

    def __del__(self):
        _recorder.saved.remove(self.key)
        if self.is_slice:
            _recorder.held.remove(self.key)


def track(tensor):
    """Count a tensor the schedule holds (saved for backward, stashed, in transit)
    in the held bytes until its memory is freed, so that one kept by mistake stays counted.
    Returns the tensor."""
    if not _recorder.enabled:
        return tensor
    if _is_slice(tensor):  # counted while this view lives
        _recorder.held.add(_key(tensor))
        weakref.finalize(tensor, _recorder.held.remove, _key(tensor))
        return tensor
    storage = tensor.untyped_storage()
    key = storage.data_ptr(), storage.nbytes()
    with _recorder.held.lock:
        if key not in _recorder.held.count:
            _recorder.held.add(key)
            # A storage's Python object, unlike a tensor's, lives exactly as long as its memory.
            weakref.finalize(storage, _recorder.held.remove, key)
    return tensor


# ----------------------------------------------------------------------------- spans
# Spans are kept as rows [step, kind, micro_batch, chunk, start, end] on rank 0's clock.


class _Recorder:
    def __init__(self):
        self.enabled = True
        self.alternate = False  # --overhead: instrument the even steps only
        self.step = 0
        self.spans = []  # [step, kind, micro_batch, chunk, start, end]
        self.steps = []  # [step, start, end]
        self.pending = []  # on CUDA: spans whose events are read once the step is over
        self.pace = 0.0  # --pace, in seconds: every computation padded to it
        self.overruns = 0  # computations that took longer than --pace
        self.posts = []  # [step, sent?, peer, tag, time]: when each send and receive was posted
        self.losses = []
        self.saved, self.held = _Meter(), _Meter()

    @staticmethod
    def pack(tensor):
        # A Linear saves its weight as a transposed view: parameters are not activations.
        if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
            return tensor
        return _Saved(tensor)

    @staticmethod
    def unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved


_recorder = _Recorder()


def _mark():
    """Now, as a number on CPU; on CUDA an event in the stream, read after the step (a synchronize
    here would make every asynchronous operation a blocking one)."""
    if _device.type != "cuda":
        return time.perf_counter() + _clock_offset
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


@contextlib.contextmanager
def record(kind, micro_batch, chunk=0):
    """Time one forward, backward, weight-gradient pass or wait; a forward also counts what it saves.
    With --pace, a computation then sleeps out the rest of its span."""
    began = time.perf_counter()
    if not _recorder.enabled:
        yield
    else:
        start = _mark()
        hooks = torch.autograd.graph.saved_tensors_hooks(_recorder.pack, _recorder.unpack)
        with hooks if kind == "forward" else contextlib.nullcontext():
            yield
    if _recorder.pace and kind != "wait":
        if _device.type == "cuda":
            torch.cuda.synchronize(_device)  # pacing times the arithmetic itself, so it waits for it
        left = began + _recorder.pace - time.perf_counter()
        _recorder.overruns += left < 0
        time.sleep(max(0.0, left))
    if _recorder.enabled:
        _recorder.pending.append([_recorder.step, KINDS.index(kind), micro_batch, chunk, start, _mark()])


def started(kind, start):
    """Requests that start() starts now, waited for later (07's gradient all-reduce): wait() on what
    this returns waits for them all, and records one span from before start() until then, so the
    span also counts the time it takes to start them."""
    begun = _mark() if _recorder.enabled else None
    return _Started(kind, start(), begun)


class _Started:
    def __init__(self, kind, requests, start):
        self.kind, self.requests, self.start = kind, requests, start

    def wait(self):
        try:
            for request in self.requests:
                request.wait()
        except RuntimeError as error:
            raise PipelineError(f"rank {_rank} gave up in {self.kind} waiting for its copies "
                                f"({str(error).splitlines()[0]}); one may be stuck, dead or itself waiting, "
                                "or just slower than --timeout") from None
        if self.start is not None:
            _recorder.pending.append([_recorder.step, KINDS.index(self.kind), 0, 0, self.start, _mark()])


def posted(send_links, recv_links):
    """Note when sends and receives to other ranks are posted: (peer, tag) each, peer a global rank."""
    if _recorder.enabled:
        now = time.perf_counter() + _clock_offset
        _recorder.posts += [[_recorder.step, sent, peer, tag, now]
                            for sent, links in ((1, send_links), (0, recv_links)) for peer, tag in links]


@contextlib.contextmanager
def timed_step(step):
    """Time one optimizer step (spans recorded inside it carry its number)."""
    _recorder.step = step
    if _recorder.alternate:
        _recorder.enabled = step % 2 == 0
    origin = (_idle_now() + _clock_offset, _mark()) if _device.type == "cuda" else None
    start = _mark()
    yield
    end = _mark()
    if origin is not None:  # the step is over: read its events against the host clock
        end.synchronize()
        seconds = lambda event: origin[0] + origin[1].elapsed_time(event) / 1e3  # noqa: E731
        _recorder.pending = [row[:4] + [seconds(row[4]), seconds(row[5])] for row in _recorder.pending]
        start, end = seconds(start), seconds(end)
    _recorder.spans += _recorder.pending
    _recorder.pending = []
    _recorder.steps.append([step, start, end])


def log_step(step, loss):
    """Print the step's loss where it lives, on the last stage, and keep it for the summary."""
    if loss is not None:
        _recorder.losses.append(loss.item())
        step_ms = 1e3 * (_recorder.steps[-1][2] - _recorder.steps[-1][1])
        print(f"step {step:4d} | loss {loss.item():.4f} | {step_ms:7.1f} ms", flush=True)


# ----------------------------------------------------------------------------- report


def report(args, stages, expected_inflight, bubble_theory=None):
    """Gather every rank's measurements on rank 0, print the timeline, the table and the JSON
    line, and end the run.

    stages: this rank's model chunks (their .layers). expected_inflight(rank): how many micro-batches
    (or micro-batch and chunk pairs) the schedule keeps alive on that rank. bubble_theory: the
    schedule's with every span equally long; without it, the schedule's order is replayed so.
    """
    cuda_peak = torch.cuda.max_memory_allocated(_device) if _device.type == "cuda" else -1
    memory = [_recorder.saved.peak, _recorder.held.peak, cuda_peak, _recorder.overruns]
    layers = [[*stage.layers] for stage in stages]
    spans, steps, losses, memory, posts, layers = (_gather(rows, width) for rows, width in (
        (_recorder.spans, 6), (_recorder.steps, 3), ([[loss] for loss in _recorder.losses], 1), ([memory], 4),
        (_recorder.posts, 5), (layers, 2)))
    if _rank == 0:
        losses = max(reversed(losses), key=len)  # the last rank that has any: the head's (rank 0 on the V)
        summary = _summarize(args, spans, steps, losses[:, 0].tolist(), memory, expected_inflight)
        if bubble_theory is not None:
            summary["bubble_theory"] = bubble_theory
        chunks = len(stages) > 1  # label spans with their model chunk
        summary["stage_layers"] = [[[int(first), int(last)] for first, last in rank.tolist()] for rank in layers]
        summary["stage_layers"] = [rank if chunks else rank[0] for rank in summary["stage_layers"]]
        if not args.no_instrument:
            _compare(args, summary, spans, posts, memory, layers, replay_theory=bubble_theory is None)
            print(_timeline(spans, chunks))
            print(_table(summary))
        else:
            print(f"step time (median) {summary['step_ms_median']:.1f} ms")
        if args.trace:
            _write_trace(args.trace, spans, chunks)
        if args.svg:
            _write_svg(args.svg, spans, chunks, summary)
        if args.json:
            print(json.dumps(summary), flush=True)
    finish()


def _compare(args, summary, spans, posts, memory, layers, replay_theory):
    """The busiest rank against the theory and against this run's order replayed at its mean span
    times, and the sends posted before their receive, over the measured steps."""
    busiest = max(range(len(spans)), key=lambda rank: summary["compute_ms"][rank])
    summary["busiest_rank"], summary["bubble_busiest"] = busiest, summary["bubble_per_rank"][busiest]
    measured = _measured_steps(args)
    rows = torch.cat([s[torch.isin(s[:, 0], torch.tensor(measured, dtype=s.dtype))] for s in spans])
    summary["span_ms"] = {kind: 1e3 * float((picked[:, 5] - picked[:, 4]).mean()) for index, kind in
                          enumerate(KINDS[:3]) if len(picked := rows[rows[:, 1] == index])}
    last = [s[s[:, 0] == measured[-1]] for s in spans]
    orders = [[tuple(int(x) for x in span[1:4]) for span in sorted(rows.tolist(), key=lambda span: span[4])
               if span[1] < KINDS.index("wait")] for rows in last]
    stages = len(spans) // args.data_parallel  # replayed pipeline by pipeline: each has every stage
    replayed = lambda span_ms: [bubble for first in range(0, len(spans), stages) for bubble in  # noqa: E731
                                _replay(orders[first:first + stages], layers[first:first + stages], span_ms)]
    summary["bubble_at_costs"] = replayed(summary["span_ms"])[busiest]
    if replay_theory:  # no closed form given: the schedule's order with every span one unit long
        summary["bubble_theory"] = replayed(dict.fromkeys(summary["span_ms"], 1.0))[busiest]
    # A send is matched with its receive by sender, receiver, tag and order, as gloo matches them.
    early = [0] * len(spans)
    queues = {}
    for rank, rows in enumerate(posts):
        for step, sent, peer, tag, when in rows.tolist():
            if step in measured:
                sender, receiver = (rank, int(peer)) if sent else (int(peer), rank)
                queues.setdefault((step, sender, receiver, tag, sent), []).append(when)
    for (step, sender, receiver, tag, sent), times in queues.items():
        if sent:
            receives = queues.get((step, sender, receiver, tag, 0), [])
            early[sender] += sum(when < received for when, received in zip(times, receives))
    summary["sends_before_receive"] = early
    summary["pace_ms"], summary["paced_overruns"] = args.pace, sum(int(rank[0, 3]) for rank in memory)


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
    world, n, m, v = _world_size, _world_size // args.data_parallel, args.micro_batches, args.virtual_stages
    timed = _timed_steps(args)
    step_ms = {step: 1e3 * (max(float(s[step, 2]) for s in steps) - min(float(s[step, 1]) for s in steps))
               for step in timed}
    measured = _measured_steps(args)
    summary = {
        "script": os.path.basename(sys.argv[0]), "world_size": world, "data_parallel": args.data_parallel,
        "num_microbatches": m, "virtual_stages": v,
        "batch_size": args.batch_size, "layers": args.layers, "hidden": args.hidden, "dtype": args.dtype,
        "steps": args.steps, "threads": args.threads, "sync_sends": args.sync_sends, "losses": losses,
        "step_ms_median": _median([step_ms[step] for step in measured]),
    }
    if args.overhead:
        summary["step_ms_median_bare"] = _median([step_ms[step] for step in timed if step % 2])
    if args.no_instrument:
        return summary
    compute, windows, reduced, hidden = ([0.0] * world for _ in range(4))
    inflight = [0] * world
    for step in measured:
        work = [s[(s[:, 0] == step) & (s[:, 1] < KINDS.index("wait"))] for s in spans]
        for first in range(0, world, n):  # each pipeline: ranks first to first + n - 1
            # The bubble is measured against the pipeline's own span: from the first forward
            # anywhere in it to the last computation anywhere in it. Blocked in a receive counts as idle.
            begin = min(float(w[:, 4].min()) for w in work[first:first + n])
            end = max(float(w[:, 5].max()) for w in work[first:first + n])
            for rank in range(first, first + n):
                windows[rank] += end - begin
                # 07's all-reduce is hidden for as long as it overlaps the pipeline's span
                for start, stop in spans[rank][(spans[rank][:, 0] == step) &
                                               (spans[rank][:, 1] == KINDS.index("allreduce"))][:, 4:].tolist():
                    reduced[rank] += stop - start
                    hidden[rank] += max(0.0, min(stop, end) - start)
        for rank, w in enumerate(work):
            compute[rank] += float((w[:, 5] - w[:, 4]).sum())
            inflight[rank] = max(inflight[rank], _peak_inflight(w))
    idle = [window - c for window, c in zip(windows, compute)]
    summary.update({
        "bubble_measured": sum(i / window for i, window in zip(idle, windows)) / world,
        "bubble_per_rank": [i / window for i, window in zip(idle, windows)],
        "compute_ms": [1e3 * c / len(measured) for c in compute],
        "idle_ms": [1e3 * i / len(measured) for i in idle],
        "peak_inflight_microbatches": inflight,
        "expected_inflight_microbatches": [expected_inflight(rank) for rank in range(world)],
        "peak_activation_bytes": [int(rank[0, 0]) for rank in memory],
        "peak_held_bytes": [int(rank[0, 1]) for rank in memory],
    })
    if any(reduced):
        summary["allreduce_ms"] = [1e3 * r / len(measured) for r in reduced]
        summary["allreduce_hidden_ms"] = [1e3 * h / len(measured) for h in hidden]
    if _device.type == "cuda":
        summary["cuda_max_memory_allocated"] = [int(rank[0, 2]) for rank in memory]
    return summary


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
                needs = {"forward": ("forward", stage - 1),
                         "backward": ("backward", stage + 1) if stage < num_stages - 1 else ("forward", stage),
                         "weight": ("backward", stage)}[kind]
                if needs[1] >= 0 and (needs[0], micro_batch, needs[1]) not in ends:
                    break  # its input is not ready yet: another rank first
                start = max(clock[rank], ends.get((needs[0], micro_batch, needs[1]), 0.0))
                starts[stage, kind, micro_batch] = start
                clock[rank] = ends[kind, micro_batch, stage] = start + duration(kind)
                position[rank] += 1
                progress = True
    return starts


def _replay(orders, layers, span_ms):
    """Each rank's bubble if it ran its recorded order of (kind, micro_batch, chunk) rows with every span
    of a kind taking span_ms[kind]. Stages are ordered by their first layer, from `layers` (each rank's
    chunks' [first, last])."""
    firsts = sorted(float(rank[chunk, 0]) for rank in layers for chunk in range(len(rank)))
    stage_of = lambda rank, chunk: firsts.index(float(layers[rank][chunk, 0]))  # noqa: E731
    schedules = [[(KINDS[kind], chunk, micro_batch) for kind, micro_batch, chunk in order] for order in orders]
    starts = replay(schedules, stage_of, len(firsts), duration=lambda kind: span_ms[kind])
    span = max(starts[stage_of(rank, chunk), kind, micro_batch] + span_ms[kind]
               for rank, schedule in enumerate(schedules) for kind, chunk, micro_batch in schedule)
    return [1 - sum(span_ms[kind] for kind, _, _ in schedule) / span for schedule in schedules]


def _timed_steps(args):
    """The first step pays for warm-up (allocations, thread pools); measure the rest."""
    return list(range(1, args.steps)) if args.steps > 1 else [0]


def _measured_steps(args):
    """The timed steps that were instrumented (--overhead: the even ones)."""
    return [step for step in _timed_steps(args) if not args.overhead or step % 2 == 0]


def _peak_inflight(work):
    """Most (micro-batch, chunk) pairs between the start of their forward and the end of their last
    backward or weight-gradient span."""
    begin, end = {}, {}
    for _, kind, micro_batch, chunk, start, stop in work.tolist():
        if kind == KINDS.index("forward"):
            begin[micro_batch, chunk] = start
        else:
            end[micro_batch, chunk] = max(end.get((micro_batch, chunk), stop), stop)
    events = sorted([(time, 1) for time in begin.values()] + [(time, -1) for time in end.values()])
    alive = peak = 0
    for _, change in events:
        alive += change
        peak = max(peak, alive)
    return peak


def _label(kind, micro_batch, chunk, chunks):
    """F3, B3.1 (micro-batch 3, model chunk 1), W3; AR for the gradient all-reduce."""
    if KINDS[int(kind)] not in LETTERS:
        return "AR"
    return f"{LETTERS[KINDS[int(kind)]]}{int(micro_batch)}" + (f".{int(chunk)}" if chunks else "")


def _last_step(spans):
    """The last recorded step: its number, each rank's spans but its waits, their start and length."""
    step = int(spans[0][-1, 0])
    rows = [s[(s[:, 0] == step) & (s[:, 1] != KINDS.index("wait"))] for s in spans]
    start = min(float(r[:, 4].min()) for r in rows)
    return step, rows, start, max(float(r[:, 5].max()) for r in rows) - start


def _timeline(spans, chunks):
    """The last recorded step as text: a row per rank, time left to right, idle left blank."""
    step, rows, start, length = _last_step(spans)
    width = max(40, shutil.get_terminal_size().columns - 10)
    legend = "F forward, B backward" + (", W weight gradient" if any((r[:, 1] == 2).any() for r in rows) else "")
    legend += ", AR gradient all-reduce" if any((r[:, 1] == KINDS.index("allreduce")).any() for r in rows) else ""
    lines = [f"timeline of step {step} ({1e3 * length:.1f} ms; {legend}"
             f"{', .c model chunk c' if chunks else ''}; blank idle):"]
    for rank, r in enumerate(rows):
        line, taken = [" "] * width, 0
        for _, kind, micro_batch, chunk, begin, end in sorted(r.tolist(), key=lambda span: span[4]):
            first = max(taken, int((begin - start) / length * width))  # never draw over the previous span
            last = taken = min(width, max(first + 1, round((end - start) / length * width)))
            fill = "-=~ +"[int(kind)]  # in KINDS' order; waits are not drawn
            line[first:last] = (_label(kind, micro_batch, chunk, chunks) + fill * width)[: last - first]
        lines.append(f"rank {rank:2d} |{''.join(line).rstrip()}")
    return "\n".join(lines)


def _median(values):
    return sorted(values)[len(values) // 2]


def _table(summary):
    header = ("rank", "layers", "compute ms", "idle ms", "bubble", "theory", "in flight", "theory", "activations",
              "held") + ("all-reduce", "hidden") * ("allreduce_ms" in summary)  # ms each
    lines = [" ".join(f"{h:>11}" for h in header)]
    for rank in range(summary["world_size"]):
        layers = summary["stage_layers"][rank]
        layers = ",".join(f"{first}-{last - 1}" for first, last in (layers if isinstance(layers[0], list)
                                                                      else [layers]))
        lines.append(" ".join(f"{v:>11}" for v in (
            rank, layers, f"{summary['compute_ms'][rank]:.1f}", f"{summary['idle_ms'][rank]:.1f}",
            f"{summary['bubble_per_rank'][rank]:.3f}", f"{summary['bubble_theory']:.3f}",
            summary["peak_inflight_microbatches"][rank], summary["expected_inflight_microbatches"][rank],
            _bytes(summary["peak_activation_bytes"][rank]), _bytes(summary["peak_held_bytes"][rank]),
            *(f"{summary[key][rank]:.1f}" for key in ("allreduce_ms", "allreduce_hidden_ms") if key in summary))))
    if "cuda_max_memory_allocated" in summary:
        lines.append("torch.cuda.max_memory_allocated per rank: " +
                     ", ".join(_bytes(b) for b in summary["cuda_max_memory_allocated"]))
    lines.append(f"step time (median) {summary['step_ms_median']:.1f} ms, bubble {summary['bubble_measured']:.3f} "
                 f"measured (mean over ranks), {summary['bubble_theory']:.3f} in theory; busiest rank "
                 f"{summary['busiest_rank']}: {summary['bubble_busiest']:.3f}")
    if "allreduce_ms" in summary:
        lines.append("all-reduce: ms a step from the start of the rank's gradient all-reduce to its end; hidden: "
                     "the part of it within its pipeline's span (the first forward to the last computation)")
    costs = ", ".join(f"{LETTERS[kind]} {ms:.2f}" for kind, ms in summary["span_ms"].items())
    if "bubble_at_costs" in summary:
        lines.append(f"at this run's mean span times ({costs} ms) the theory is {summary['bubble_at_costs']:.3f}")
    lines.append(f"sends posted before their receive, per rank: {summary['sends_before_receive']}")
    if summary["pace_ms"]:
        lines.append(f"--pace {summary['pace_ms']:g}: every computation padded to {summary['pace_ms']:g} ms"
                     + (f"; {summary['paced_overruns']} took longer" if summary["paced_overruns"] else ""))
    if "step_ms_median_bare" in summary:
        instrumented, bare = summary["step_ms_median"], summary["step_ms_median_bare"]
        lines.append(f"--overhead: {instrumented:.1f} ms a step instrumented (even steps), {bare:.1f} ms bare "
                     f"(odd steps), medians: {100 * (instrumented / bare - 1):+.1f}%")
    return "\n".join(lines)


def _bytes(count):
    return f"{count / 2**20:.2f} MiB"


COLOURS = {"forward": "#4e79a7", "backward": "#59a14f", "weight": "#f28e2b", "allreduce": "#9c9c9c"}


def _write_svg(path, spans, chunks, summary):
    """The last recorded step as a picture: a row per rank, a box per computation (and per all-reduce),
    idle left empty."""
    step, rows, start, length = _last_step(spans)
    left, width, height = 70, max(960, 36 * max(len(r) for r in rows)), 26  # room for each box's label
    scale = lambda t: left + (t - start) / length * width  # noqa: E731
    copies = summary.get("data_parallel", 1)
    shape = (f"{summary['world_size'] // copies} stages x {copies} copies" if copies > 1
             else f"n = {summary['world_size']}") + f", m = {summary['num_microbatches']}"
    title = (f"{summary['script']}: {shape}" + (f", v = {summary['virtual_stages']}" if chunks else "")
             + (f", --pace {summary['pace_ms']:g}" if summary["pace_ms"] else "")
             + f"; step {step}, {1e3 * length:.0f} ms; bubble of the busiest rank {summary['bubble_busiest']:.3f},"
             f" theory {summary['bubble_theory']:.3f}")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 10}" '
             f'height="{height * (len(rows) + 1) + 10}" font-family="monospace" font-size="11">',
             f'<rect width="100%" height="100%" fill="white"/><text x="4" y="16">{title}</text>']
    for rank, r in enumerate(rows):
        y = height * (rank + 1)
        parts.append(f'<text x="4" y="{y + 17}">rank {rank}</text>')
        for _, kind, micro_batch, chunk, begin, end in r.tolist():
            x, w = scale(begin), max(1.0, scale(end) - scale(begin))
            label = _label(kind, micro_batch, chunk, chunks)
            parts.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{height - 6}" '
                         f'fill="{COLOURS[KINDS[int(kind)]]}" stroke="white"/>')
            if w > 7 * len(label):  # a label that fits its box
                parts.append(f'<text x="{x + w / 2:.1f}" y="{y + 17}" fill="white" text-anchor="middle">{label}</text>')
    with open(path, "w") as file:
        file.write("\n".join(parts + ["</svg>"]) + "\n")


def _write_trace(path, spans, chunks):
    """Chrome trace format: one process per rank, one complete ("X") event per span."""
    origin = min(float(s[:, 4].min()) for s in spans if len(s))
    events = []
    for rank, rows in enumerate(spans):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        for step, kind, micro_batch, chunk, start, end in rows.tolist():
            name = KINDS[int(kind)]
            label = f"{name} {int(micro_batch)}" + (f".{int(chunk)}" if chunks else "") if name in LETTERS else name
            events.append({"name": label, "cat": name, "ph": "X",
                           "pid": rank, "tid": 0, "ts": 1e6 * (start - origin), "dur": 1e6 * (end - start),
                           "args": {"step": int(step), "micro_batch": int(micro_batch), "chunk": int(chunk)}})
    with open(path, "w") as file:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, file)
