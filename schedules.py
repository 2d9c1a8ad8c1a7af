"""Pipeline schedules as data: each function returns every rank's computations in order, a list (one per rank) of
lists of (kind, chunk, micro_batch) tuples, plain Python to draw, replay and compare without a process group.

    kind     "forward" (F); "backward" (I), a split backward's gradient for the previous stage, its "weight"
             gradient (W) coming later; "full_backward" (B), both at once; "overlapped_backward", a full backward
             run as one step with the forward before it (DualPipeV). The letters are PyTorch's.
    chunk    which of the rank's model chunks, placed as SCHEDULES says: "loop", chunk c of rank r is stage
             c n + r of the n v; or "v", rank r holds stages r (chunk 0) and 2n - 1 - r (chunk 1)

Each takes n >= 1 ranks (DualPipeV 2), m >= 1 micro-batches, v >= 1 chunks; a rule that needs more micro-batches
than m (04's groups of n, ZB-V's 2n - 1, DualPipeV's 2n, PyTorch's rounds) runs for as many, leaving out the rest.
A table is a file too, in PyTorch's compute_only CSV (from_csv; load, 09's --schedule, takes a name or a file).
"""

import collections
import csv
import inspect
import itertools
import pathlib
import re

import theory


def check_counts(num_ranks, num_microbatches, num_chunks=1):
    """One sentence for a count no schedule can take."""
    for name, value in (("num_ranks", num_ranks), ("num_microbatches", num_microbatches), ("num_chunks", num_chunks)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} is {value!r}: pass a whole number, {name} >= 1.")


def split(order, weight_delay):
    """order with each full (or overlapped) backward split: I in its place, and its W after the weight_delay-th
    I that follows (those left over at the end), in the slots where the pipeline would otherwise wait."""
    split, waiting = [], []  # W's still to run, oldest first
    for kind, chunk, micro_batch in order:
        full = kind in ("full_backward", "overlapped_backward")
        split.append(("backward" if full else kind, chunk, micro_batch))
        if full:
            waiting.append(("weight", chunk, micro_batch))
            if len(waiting) > weight_delay:
                split.append(waiting.pop(0))
    return split + waiting


def _with_micro_batches(order, num_microbatches):
    """Give each (kind, chunk) of a V schedule its micro-batch: the k-th forward of a chunk is micro-batch k, and
    so is its k-th I or B; a W runs the oldest I of its chunk (of any chunk if None)
    still without one, as DeepSeek's WeightGradStore does. Entries past num_microbatches are holes, left out."""
    counts, waiting, numbered = {}, [], []
    for kind, chunk in order:
        if kind == "weight":
            weight = next(entry for entry in waiting if chunk in (None, entry[1]))
            numbered.append(weight)
            waiting.remove(weight)
            continue
        key = kind == "forward", chunk  # an I and a B (full or overlapped) share one count
        micro_batch = counts[key] = counts.get(key, -1) + 1
        numbered.append((kind, chunk, micro_batch))
        if kind == "backward":
            waiting.append(("weight", chunk, micro_batch))
    return [entry for entry in numbered if entry[2] < num_microbatches]


def _interleaved(num_microbatches, num_chunks, group_size, num_warmup_microbatches):
    """One rank's interleaved 1F1B, Megatron-LM's: micro-batches in groups of group_size through chunk 0, then
    chunk 1, ..., backwards through the chunks in reverse; warm-up forwards, then one forward and one backward
    in turn, then the backwards left."""
    # forwards (and backwards): m rounded up to whole groups, for each chunk; those past m are holes
    total_num_microbatches = -(-num_microbatches // group_size) * group_size * num_chunks
    num_warmup_microbatches = min(num_warmup_microbatches, total_num_microbatches)
    num_microbatches_remaining = total_num_microbatches - num_warmup_microbatches

    def get_model_chunk_id(k, forward):
        chunk = k % (group_size * num_chunks) // group_size
        return chunk if forward else num_chunks - 1 - chunk

    def get_microbatch_id(k):
        return k // (group_size * num_chunks) * group_size + k % group_size

    def forward(k):
        return "forward", get_model_chunk_id(k, forward=True), get_microbatch_id(k)

    def backward(k):
        return "full_backward", get_model_chunk_id(k, forward=False), get_microbatch_id(k)

    order = [forward(k) for k in range(num_warmup_microbatches)]
    for i in range(num_microbatches_remaining):  # steady state: forward j, then backward i
        order += [forward(num_warmup_microbatches + i), backward(i)]
    order += [backward(i) for i in range(num_microbatches_remaining, total_num_microbatches)]
    return [entry for entry in order if entry[2] < num_microbatches]


def gpipe(num_ranks, num_microbatches):
    """02: every forward, then every backward, the last micro-batch first (PyTorch's ScheduleGPipe: the first)."""
    check_counts(num_ranks, num_microbatches)
    return [[("forward", 0, i) for i in range(num_microbatches)]
            + [("full_backward", 0, i) for i in reversed(range(num_microbatches))] for _ in range(num_ranks)]


def one_f_one_b(num_ranks, num_microbatches):
    """03: warm-up forwards, then one forward and one backward in turn, then cool-down backwards."""
    check_counts(num_ranks, num_microbatches)
    tables = []
    for rank in range(num_ranks):
        # Stage r runs n - r - 1 forwards ahead of its first backward (all of them if m is smaller).
        num_warmup_microbatches = min(num_ranks - rank - 1, num_microbatches)
        num_microbatches_remaining = num_microbatches - num_warmup_microbatches
        order = [("forward", 0, i) for i in range(num_warmup_microbatches)]
        for i in range(num_microbatches_remaining):  # steady state: forward j, then backward i
            order += [("forward", 0, num_warmup_microbatches + i), ("full_backward", 0, i)]
        order += [("full_backward", 0, i) for i in range(num_microbatches_remaining, num_microbatches)]
        tables.append(order)
    return tables


def interleaved_1f1b(num_ranks, num_microbatches, num_chunks):
    """04: Megatron-LM's interleaved 1F1B, groups of n micro-batches (holes past m), loop placement. Where n divides
    m, PyTorch's ScheduleInterleaved1F1B; its groups are otherwise its rounds, m // max(1, m // n) micro-batches."""
    check_counts(num_ranks, num_microbatches, num_chunks)
    tables = []
    for rank in range(num_ranks):
        # a lap of the ring per chunk but the last, and 2 (n - r - 1): micro-batch 0's trip to the last rank and back
        num_warmup_microbatches = (num_chunks - 1) * num_ranks + 2 * (num_ranks - rank - 1)
        tables.append(_interleaved(num_microbatches, num_chunks, num_ranks, num_warmup_microbatches))
    return tables


def zb_h1(num_ranks, num_microbatches):
    """05: 1F1B with each B split into I and W, its W run r I's later on rank r."""
    # stage r's I's end r slots before stage 0's: its W's fill them
    return [split(order, rank) for rank, order in enumerate(one_f_one_b(num_ranks, num_microbatches))]


def zbv(num_ranks, num_microbatches):
    """06: PyTorch's ZB-V rule, two chunks placed as a V. The rule needs 2n - 1 micro-batches."""
    check_counts(num_ranks, num_microbatches)
    F0, I0, W0, F1, I1, W1 = [(kind, chunk) for chunk in (0, 1) for kind in ("forward", "backward", "weight")]
    num_microbatches_needed = max(num_microbatches, 2 * num_ranks - 1)
    tables = []
    for rank in range(num_ranks):
        # Warm-up: chunk 0's forwards until micro-batch 0 is back up at chunk 1, then both in turn, then chunk 1's.
        order = [F0] * (2 * (num_ranks - rank) - 1) + [F1, F0] * rank + [F1, I1, W1] * (num_ranks - rank)
        # Steady state: F, I and W on chunk 0, then on chunk 1, until chunk 1 has caught up.
        forwards0, forwards1 = order.count(F0), order.count(F1)
        while forwards1 < forwards0 or forwards0 < num_microbatches_needed:
            another = forwards0 < num_microbatches_needed  # chunk 0 has micro-batches left
            order += [F0] * another + [I0, W0, F1, I1, W1]
            forwards0, forwards1 = forwards0 + another, forwards1 + 1
        # Cool-down: the I's left, W's deferred into the slots where the pipeline drains.
        order += [I0, I1] * rank + [I0, W0] * (num_ranks - rank)
        order += [W1] * (order.count(I1) - order.count(W1)) + [W0] * (order.count(I0) - order.count(W0))
        tables.append(_with_micro_batches(order, num_microbatches))
    return tables


def dualpipev(num_ranks, num_microbatches):
    """DeepSeek's DualPipeV (PyTorch's ScheduleDualPipeV), two chunks placed as a V, in the paper's eight phases
    (named as DeepSeek's code names them, its B an I where a W follows).
    An overlapped F&B step (O) is its forward, then an "overlapped_backward": a full backward that receives its
    gradient before the forward begins and sends its result with the forward's. PyTorch needs m >= 2n; fewer: holes."""
    check_counts(num_ranks, num_microbatches)
    if num_ranks < 2:  # one rank would overlap a micro-batch's F with its own B: nothing runs beside anything
        raise ValueError("DualPipeV overlaps the V's two arms on 2 or more ranks: start more ranks, or run zbv.")
    n, num_microbatches_needed = num_ranks, max(num_microbatches, 2 * num_ranks)
    F0, F1, B0, B1 = ("forward", 0), ("forward", 1), ("full_backward", 0), ("full_backward", 1)
    O0, O1 = ("overlapped_backward", 0), ("overlapped_backward", 1)  # each one step with the forward before it
    if num_microbatches < 2 * n:  # with holes a step could wait for its own forward's result: no overlap then
        O0, O1 = B0, B1
    I0, I1, W = ("backward", 0), ("backward", 1), ("weight", None)  # I: split backward; W: the oldest still waiting
    tables = []
    for rank in range(n):
        order = [F0] * 2 * (n - rank - 1)  # nF0: chunk 0's forwards while micro-batch 0 goes to the V's turn and back
        order += [F0, F1] * (rank + 1)  # nF0F1: chunk 0 and chunk 1 in turn
        order += [I1, W, F1] * (n - rank - 1)  # nB1W1F1: zero bubble, a W where chunk 0's backwards are not due yet
        order += [F0, O1, F1, O0] * (num_microbatches_needed - 2 * n + rank + 1)  # nF0B1F1B0: two overlapped F&B
        if rank == n - 1:  # the bottom rank runs its first F0 alone, before B1's gradient is back (DeepSeek's)
            order[2 * n:2 * n + 2] = [F0, B1]
        order += [B1, F1, O0] * (n - rank - 1)  # nB1F1B0: chunk 0's forwards are done
        order += ([B1, B0] * (rank + 1))[:rank + 1] + ([I1, I0] * (rank + 1))[rank + 1:]  # nB1B0: the second half split
        order += [W, I0] * (n - rank - 1)  # nWB0: a W in each wait for the next I0
        order += [W] * (rank + 1)  # nW: the W's left
        tables.append(_with_micro_batches(order, num_microbatches))
    return tables


def looped_bfs(num_ranks, num_microbatches, num_chunks):
    """PyTorch's ScheduleLoopedBFS (breadth first): every micro-batch through chunk 0, then chunk 1, ...; then the
    backwards, the last chunk and the last micro-batch first. Loop placement."""
    check_counts(num_ranks, num_microbatches, num_chunks)
    order = [("forward", chunk, i) for chunk in range(num_chunks) for i in range(num_microbatches)]
    order += [("full_backward", chunk, i) for _, chunk, i in reversed(order)]  # the forwards, undone in reverse
    return [list(order) for _ in range(num_ranks)]


def interleaved_zero_bubble(num_ranks, num_microbatches, num_chunks):
    """PyTorch's ScheduleInterleavedZeroBubble (ZB1P): interleaved 1F1B in PyTorch's rounds, one warm-up forward
    per hop to the last rank, not two, and each B split into I and W, its W run r I's later. Loop placement."""
    check_counts(num_ranks, num_microbatches, num_chunks)
    # PyTorch's microbatches_per_round; where it does not divide m (PyTorch refuses those m), holes
    group_size = num_microbatches // max(1, num_microbatches // num_ranks)
    tables = []
    for rank in range(num_ranks):
        num_warmup_microbatches = (num_chunks - 1) * group_size + num_ranks - rank - 1
        tables.append(split(_interleaved(num_microbatches, num_chunks, group_size, num_warmup_microbatches), rank))
    return tables


SCHEDULES = {  # name, as --schedule takes it: (function, placement); the script that runs it, or PyTorch's class
    "gpipe": (gpipe, "loop"),  # 02_gpipe.py
    "1f1b": (one_f_one_b, "loop"),  # 03_1f1b.py
    "interleaved-1f1b": (interleaved_1f1b, "loop"),  # 04_interleaved_1f1b.py
    "zb-h1": (zb_h1, "loop"),  # 05_zero_bubble.py
    "zbv": (zbv, "v"),  # 06_zbv.py, ScheduleZBVZeroBubble
    "dualpipev": (dualpipev, "v"),  # ScheduleDualPipeV
    "looped-bfs": (looped_bfs, "loop"),  # ScheduleLoopedBFS
    "interleaved-zero-bubble": (interleaved_zero_bubble, "loop"),  # ScheduleInterleavedZeroBubble
}


def takes_virtual_stages(name):
    """Whether the schedule takes num_chunks, the model chunks per rank (the V's hold two); a sentence if unknown."""
    if name not in SCHEDULES:
        raise ValueError(f"There is no schedule named {name!r}: pass one of {', '.join(SCHEDULES)}.")
    return "num_chunks" in inspect.signature(SCHEDULES[name][0]).parameters


def table(name, num_ranks, num_microbatches, num_chunks=2):
    """Every rank's computations in order for the schedule `name`; num_chunks goes to the schedules that take it."""
    chunks = (num_chunks,) if takes_virtual_stages(name) else ()
    return SCHEDULES[name][0](num_ranks, num_microbatches, *chunks)


LETTERS = {"forward": "F", "backward": "I", "weight": "W", "full_backward": "B", "overlapped_backward": "B"}
KINDS = {"F": "forward", "I": "backward", "W": "weight", "B": "full_backward"}  # a CSV cell's letter: our kind
Schedule = collections.namedtuple("Schedule", "placement num_chunks tables")  # a table, and where its chunks sit


def _actions(rank, cell):
    """One CSV cell's (kind, stage, micro_batch): one, or an overlapped F&B step's two; or one sentence."""
    pair = re.fullmatch(r"\((.*);(.*)\)OVERLAP_F_B", cell)
    parts = [re.fullmatch(r"(\d+)([FIWB])(\d+)", part.strip()) for part in (pair.groups() if pair else [cell])]
    if None in parts or (pair and [part[2] for part in parts] != ["F", "B"]):
        raise ValueError(f"rank {rank}'s cell {cell!r} is no compute action: write the stage, F, I, W or B and the "
                         "micro-batch (0F3), or (0F3;1B2)OVERLAP_F_B for an overlapped F&B step.")
    kinds = ["forward", "overlapped_backward"] if pair else [KINDS[parts[0][2]]]
    return [(kind, int(part[1]), int(part[3])) for kind, part in zip(kinds, parts)]


def from_csv(text, num_microbatches):
    """A Schedule from PyTorch's compute_only CSV, placed as its rows' stages say; or one sentence on what is wrong."""
    rows = [[cell.strip() for cell in row if cell.strip()] for row in csv.reader(text.splitlines())]
    if not rows or [] in rows:
        raise ValueError("it has no rows, or an empty one: write a row of actions for each rank.")
    actions = [[action for cell in row for action in _actions(rank, cell)] for rank, row in enumerate(rows)]
    held = [sorted({stage for _, stage, _ in order}) for order in actions]  # the stages each rank holds, rising
    num_ranks, num_chunks = len(rows), max(len(stages) for stages in held)
    placed = {where: [[theory.stage(where, num_ranks, rank, chunk) for chunk in range(num_chunks)]
                      for rank in range(num_ranks)] for where in ("loop", "v") if where == "loop" or num_chunks == 2}
    placement = next((where for where, stages in placed.items() if stages == held), None)  # the V holds two chunks
    if placement is None:
        raise ValueError(f"its rows hold stages {held}: 09 runs stages 0 to n v - 1 placed as the loop (rank r holds "
                         "r, r + n, r + 2n, ...) or the V (rank r holds r and 2n - 1 - r).")
    counts = collections.Counter(action for order in actions for action in order)
    num_run = 1 + max(micro_batch for _, _, micro_batch in counts)
    if num_run != num_microbatches:
        raise ValueError(f"it runs micro-batches 0 to {num_run - 1}: pass --micro-batches {num_run}.")
    for stage, i in itertools.product(range(num_ranks * num_chunks), range(num_microbatches)):
        forwards, weights = counts["forward", stage, i], counts["weight", stage, i]
        backwards = sum(counts[kind, stage, i] for kind in theory.BACKWARDS)  # I, B or an overlapped B
        if (forwards, backwards, weights) != (1, 1, counts["backward", stage, i]):
            raise ValueError(f"stage {stage} runs micro-batch {i}'s F, I or B, and W {forwards}, {backwards} and "
                             f"{weights} times: run F and then I or B once, and a W after an I.")
    tables = [[(kind, stage // num_ranks, i) for kind, stage, i in order] for order in actions]  # either placement
    spans = theory.replay(tables, lambda rank, chunk: held[rank][chunk], num_ranks * num_chunks)
    stuck = [(rank, action) for rank, order in enumerate(actions) for action in order if action not in spans]
    if stuck:
        rank, (kind, stage, i) = stuck[0]
        raise ValueError(f"rank {rank} waits forever at {stage}{LETTERS[kind]}{i}'s step: its input is made after it.")
    return Schedule(placement, num_chunks, tables)


def load(schedule, num_ranks, num_microbatches, num_chunks=None):
    """09's --schedule: a table by its name (num_chunks, --virtual-stages, for those that take it: 2 unless given),
    or from a .csv file. A Schedule, or ValueError with one sentence."""
    if schedule.endswith(".csv"):
        try:
            found = from_csv(pathlib.Path(schedule).read_text(), num_microbatches)
        except OSError as error:
            raise ValueError(f"cannot read it ({error.strerror}): pass a compute_only CSV, as plan.py --save writes.")
        if num_chunks not in (None, found.num_chunks) or len(found.tables) != num_ranks:
            raise ValueError(f"the file places {found.num_chunks} chunk(s) a rank on {len(found.tables)} rank(s): "
                             "start as many, and pass that --virtual-stages or none.")
        return found
    takes_chunks = takes_virtual_stages(schedule)  # a name we have, or a sentence
    placement = SCHEDULES[schedule][1]
    own = 2 if placement == "v" else 1  # the chunks a rank holds where the schedule takes no count
    if num_chunks not in (None, own) and not takes_chunks:
        raise ValueError(f"it places {own} chunk(s) a rank: pass that --virtual-stages or none.")
    num_chunks = (2 if takes_chunks else own) if num_chunks is None else num_chunks
    return Schedule(placement, num_chunks, table(schedule, num_ranks, num_microbatches, num_chunks))
