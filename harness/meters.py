"""What each rank measures as it runs, on rank 0's clock: the bytes its schedule holds, a span for
each computation and wait, each step's time, and when each send and receive was posted."""

import contextlib
import threading
import time
import weakref
from collections import namedtuple

import torch
import torch.nn as nn

import theory
from harness import transport

# the kinds of span that compute, F, I, W and B as the README names them; the others: "wait", "allreduce", TP
COMPUTE = ("forward", "backward", "weight", "full_backward")
TP = "tp_allreduce"  # 08's tensor-parallel all-reduces and gathers, inside its forwards and backwards

# The records, times in seconds on rank 0's clock (on CUDA a span's are events until its step is over): a computation,
# a wait for a receive or a send, or a collective (kind; nbytes: the size of what it made); one optimizer step (cpu:
# the CPU seconds the process, all its threads, used in it); a send or a receive posted to another rank (peer: a
# global rank; nbytes: its tensor's).
Span = namedtuple("Span", "step kind micro_batch chunk start end nbytes", defaults=[0])
StepTime = namedtuple("StepTime", "step start end cpu")
Post = namedtuple("Post", "step is_send peer tag time nbytes")
_Region = namedtuple("_Region", "address nbytes")  # memory that one or more tensors hold


class _Meter:
    """Bytes held, each region of memory counted once however many tensors hold it."""

    def __init__(self):
        self.count, self.bytes, self.peak = {}, 0, 0
        self.owners = {}  # id of a weak reference to an owner -> (the reference, the region the owner holds)
        self.lock = threading.RLock()  # storages are also freed on gloo's threads

    def hold(self, region, owner):
        """Count the region until the owner (a tensor, a storage, a _Saved) is freed."""
        reference = weakref.ref(owner, self._release)  # called back once the owner is freed
        with self.lock:
            if self.count.get(region, 0) == 0:
                self.bytes += region.nbytes
                self.peak = max(self.peak, self.bytes)
            self.count[region] = self.count.get(region, 0) + 1
            self.owners[id(reference)] = reference, region

    def _release(self, reference):
        with self.lock:
            _, region = self.owners.pop(id(reference))
            self.count[region] -= 1
            if self.count[region] == 0:
                del self.count[region]
                self.bytes -= region.nbytes


class _Recorder:
    """This rank's records so far, its device, its offset to rank 0's clock, a message's latency, and the switches
    that --no-instrument, --overhead and --pace set."""

    def __init__(self):
        self.device, self.offset = torch.device("cpu"), 0.0  # offset: add to time.perf_counter() for rank 0's clock
        self.latency = 0.0  # seconds an activation takes to the next stage, measured at start-up (rank 0's)
        self.enabled, self.alternate = True, False  # alternate (--overhead): instrument the even steps only
        self.pace, self.overruns = 0.0, 0  # --pace in seconds, and the computations that took longer
        self.paces = [1.0]  # each of this rank's chunks' span in paces (pace_at)
        self.share = 1.0  # of its span, the next computations' pace (pace_share)
        self.spans, self.steps, self.posts, self.losses = [], [], [], []  # Span, StepTime, Post, float
        self.step, self.pending = 0, []  # the step's number and spans (on CUDA, events read once it is over)
        self.saved, self.held = _Meter(), _Meter()


recorder = _Recorder()


def idle_now():
    """perf_counter once this device has finished its work: only between steps, never inside one."""
    if recorder.device.type == "cuda":
        torch.cuda.synchronize(recorder.device)
    return time.perf_counter()


def mark():
    """Now, as a number on CPU; on CUDA an event in the stream, read after the step (a synchronize
    here would make every asynchronous operation a blocking one)."""
    if recorder.device.type != "cuda":
        return time.perf_counter() + recorder.offset
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _region(tensor):
    # Micro-batches cut from one batch share a storage: count the bytes a tensor spans.
    return _Region(tensor.data_ptr(), tensor.numel() * tensor.element_size())


def _is_slice(tensor):
    # A micro-batch of the data is a slice of the batch, which lives for the whole step whatever
    # the schedule: it counts while autograd (or W) keeps it, not while its memory lives.
    return tensor.untyped_storage().nbytes() > _region(tensor).nbytes


class _Saved:
    """One tensor autograd keeps for backward, counted in the activation bytes while autograd keeps it."""

    def __init__(self, tensor):
        self.tensor, region = tensor, _region(tensor)
        recorder.saved.hold(region, self)
        if _is_slice(tensor):
            recorder.held.hold(region, self)
        else:
            track(tensor)


def _pack(tensor):
    # A Linear saves its weight as a transposed view: parameters are not activations.
    return tensor if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter) else _Saved(tensor)


def _unpack(saved):
    return saved.tensor if isinstance(saved, _Saved) else saved


def track(tensor):
    """Count a tensor the schedule holds (saved for backward, stashed, in transit) in the held bytes until
    its memory is freed, so that one kept by mistake stays counted. Returns the tensor."""
    if not recorder.enabled:
        return tensor
    if _is_slice(tensor):  # counted while this view lives
        recorder.held.hold(_region(tensor), tensor)
        return tensor
    storage = tensor.untyped_storage()
    region = _Region(storage.data_ptr(), storage.nbytes())
    with recorder.held.lock:
        if region not in recorder.held.count:
            recorder.held.hold(region, storage)  # a storage's Python object lives exactly as long as its memory
    return tensor


@contextlib.contextmanager
def record(kind, micro_batch, chunk=0):
    """Time one forward, backward, weight-gradient pass or wait; a forward or a backward (--recompute's runs
    the forward again) also counts what it saves. With --pace, a computation then sleeps out the rest of its span."""
    began, start = time.perf_counter(), mark() if recorder.enabled else None
    hooks = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
    computes = kind in COMPUTE
    if computes:
        transport.computing(True)
    with hooks if recorder.enabled and kind in ("forward", "backward", "full_backward") else contextlib.nullcontext():
        yield
    if computes:
        transport.computing(False)
    if recorder.pace and kind != "wait":
        if recorder.device.type == "cuda":
            torch.cuda.synchronize(recorder.device)  # pacing times the arithmetic itself, so it waits for it
        left = began + recorder.pace * recorder.share * recorder.paces[chunk] - time.perf_counter()
        recorder.overruns += left < 0
        time.sleep(max(0.0, left))
    if recorder.enabled:
        recorder.pending.append(Span(recorder.step, kind, micro_batch, chunk, start, mark()))


def pace_at(costs, stages):
    """--pace by cost: a computation of this rank's chunk c lasts the pace times its stage's share of the mean
    stage's cost (theory.paced_spans). costs: every stage's (theory.counted_costs); stages: the stage of each chunk."""
    spans = theory.paced_spans(costs)
    recorder.paces = [spans[stage]["forward"] for stage in stages]


def pace_share(share):
    """--pace the computations from now on at this share of their spans (09: an F&B step's parts at --overlap)."""
    recorder.share = share


def posted(messages):
    """Note when sends and receives to other ranks are posted: each a harness.guarantees.Message."""
    if recorder.enabled:
        now = time.perf_counter() + recorder.offset
        recorder.posts += [Post(recorder.step, message.is_send, message.peer, message.tag, now,
                                message.tensor.nbytes) for message in messages]


@contextlib.contextmanager
def timed_step(step):
    """Time one optimizer step (spans recorded inside it carry its number)."""
    recorder.step = step
    transport.step_begins()
    if recorder.alternate:
        recorder.enabled = step % 2 == 0
    on_cuda = recorder.device.type == "cuda"
    if on_cuda:  # an event at a known time on the host's clock, to read the step's events against
        origin_seconds, origin = idle_now() + recorder.offset, mark()
    start, cpu_start = mark(), time.process_time()
    yield
    end, cpu = mark(), time.process_time() - cpu_start
    if on_cuda:  # the step is over: read its events
        end.synchronize()
        seconds = lambda event: origin_seconds + origin.elapsed_time(event) / 1e3  # noqa: E731
        recorder.pending = [span._replace(start=seconds(span.start), end=seconds(span.end))
                            for span in recorder.pending]
        start, end = seconds(start), seconds(end)
    recorder.spans += recorder.pending
    recorder.pending = []
    recorder.steps.append(StepTime(step, start, end, cpu))


def log_step(step, loss):
    """Print the step's loss where it lives, on the last stage, and keep it for the summary."""
    if loss is not None:
        recorder.losses.append(loss.item())
        step_ms = 1e3 * (recorder.steps[-1].end - recorder.steps[-1].start)
        print(f"step {step:4d} | loss {loss.item():.4f} | {step_ms:7.1f} ms", flush=True)
