"""Pipeline schedules as data: each function returns every rank's computations in order, a list (one per rank)
of lists of (kind, chunk, micro_batch) tuples. Plain Python: a schedule can be drawn, replayed and compared
without a process group.

    kind     "forward"; "backward", the gradient for the previous stage only, its "weight" gradient (W) coming
             later (a split backward); "full_backward", both at once; or "overlapped_backward", a full backward
             run as one step with the forward before it (DualPipeV)
    chunk    which of the rank's model chunks, placed as SCHEDULES says: "loop", chunk c of rank r is stage
             c n + r of the n v; or "v", rank r holds stages r (chunk 0) and 2n - 1 - r (chunk 1)

    name (--schedule)        function                                 placement
    gpipe                    gpipe(n, m)                              loop, 1 chunk   02_gpipe.py
    1f1b                     one_f_one_b(n, m)                        loop, 1 chunk   03_1f1b.py
    interleaved-1f1b         interleaved_1f1b(n, m, v)                loop, v chunks  04_interleaved_1f1b.py
    zb-h1                    zb_h1(n, m)                              loop, 1 chunk   05_zero_bubble.py
    zbv                      zbv(n, m)                                v, 2 chunks     06_zbv.py, ScheduleZBVZeroBubble
    dualpipev                dualpipev(n, m)                          v, 2 chunks     ScheduleDualPipeV
    looped-bfs               looped_bfs(n, m, v)                      loop, v chunks  ScheduleLoopedBFS
    interleaved-zero-bubble  interleaved_zero_bubble(n, m, v)         loop, v chunks  ScheduleInterleavedZeroBubble

Every function takes any n >= 1 ranks (DualPipeV: 2 or more), m >= 1 micro-batches and v >= 1 chunks, and
anything else raises ValueError. Where a rule needs more micro-batches than m (04's groups of n, ZB-V's 2n - 1,
DualPipeV's 2n, PyTorch's whole rounds), it is run for as many as it needs and the entries of those past m are
holes, left out: whole micro-batches dropped from an order that runs still leave one that runs. PyTorch takes
fewer layouts: Schedule1F1B m >= n, ScheduleDualPipeV m >= 2n, its interleaved schedules m a multiple of
max(1, m // n).

    table("1f1b", 4, 8)[0]  # rank 0: [("forward", 0, 0), ("forward", 0, 1), ("forward", 0, 2), ...]

search(n, m, placement, costs, memory) finds a table instead, for given F, B and W times and a memory, never
slower than one above of that placement and chunks that fits it; best_search tries each placement (tools/plan.py,
09's --schedule search).
"""

import heapq
import inspect
import math

import theory


def _check(num_ranks, num_microbatches, num_chunks=1):
    """One sentence for a count no schedule can take."""
    for name, value in (("num_ranks", num_ranks), ("num_microbatches", num_microbatches), ("num_chunks", num_chunks)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} is {value!r}: pass a whole number, {name} >= 1.")


def _split(order, weight_delay):
    """order with each full (or overlapped) backward split: B in its place, and its W after the weight_delay-th
    backward that follows (those left over at the end), in the slots where the pipeline would otherwise wait."""
    split, waiting = [], []  # W's still to run, oldest first
    for kind, chunk, micro_batch in order:
        full = kind in ("full_backward", "overlapped_backward")
        split.append(("backward" if full else kind, chunk, micro_batch))
        if full:
            waiting.append(("weight", chunk, micro_batch))
            if len(waiting) > weight_delay:
                split.append(waiting.pop(0))
    return split + waiting


def _number(order, num_microbatches):
    """Give each (kind, chunk) of a V schedule its micro-batch: the k-th forward of a chunk is micro-batch k, and
    so is its k-th backward, split or full; a W runs the oldest split backward of its chunk (of any chunk if None)
    still without one, as DeepSeek's WeightGradStore does. Entries past num_microbatches are holes, left out."""
    counts, waiting, numbered = {}, [], []
    for kind, chunk in order:
        if kind == "weight":
            weight = next(entry for entry in waiting if chunk in (None, entry[1]))
            numbered.append(weight)
            waiting.remove(weight)
            continue
        key = kind == "forward", chunk  # a split and a full backward share one count
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
    _check(num_ranks, num_microbatches)
    return [[("forward", 0, i) for i in range(num_microbatches)]
            + [("full_backward", 0, i) for i in reversed(range(num_microbatches))] for _ in range(num_ranks)]


def one_f_one_b(num_ranks, num_microbatches):
    """03: warm-up forwards, then one forward and one backward in turn, then cool-down backwards."""
    _check(num_ranks, num_microbatches)
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
    _check(num_ranks, num_microbatches, num_chunks)
    tables = []
    for rank in range(num_ranks):
        # a lap of the ring per chunk but the last, and 2 (n - r - 1): micro-batch 0's trip to the last rank and back
        num_warmup_microbatches = (num_chunks - 1) * num_ranks + 2 * (num_ranks - rank - 1)
        tables.append(_interleaved(num_microbatches, num_chunks, num_ranks, num_warmup_microbatches))
    return tables


def zb_h1(num_ranks, num_microbatches):
    """05: 1F1B with each backward split, its W run r backwards later on rank r."""
    # stage r's B's end r slots before stage 0's: its W's fill them
    return [_split(order, rank) for rank, order in enumerate(one_f_one_b(num_ranks, num_microbatches))]


def zbv(num_ranks, num_microbatches):
    """06: PyTorch's ZB-V rule, two chunks placed as a V. The rule needs 2n - 1 micro-batches."""
    _check(num_ranks, num_microbatches)
    F0, B0, W0, F1, B1, W1 = [(kind, chunk) for chunk in (0, 1) for kind in ("forward", "backward", "weight")]
    num_microbatches_needed = max(num_microbatches, 2 * num_ranks - 1)
    tables = []
    for rank in range(num_ranks):
        # Warm-up: chunk 0's forwards until micro-batch 0 is back up at chunk 1, then both in turn, then chunk 1's.
        order = [F0] * (2 * (num_ranks - rank) - 1) + [F1, F0] * rank + [F1, B1, W1] * (num_ranks - rank)
        # Steady state: F, B and W on chunk 0, then on chunk 1, until chunk 1 has caught up.
        forwards0, forwards1 = order.count(F0), order.count(F1)
        while forwards1 < forwards0 or forwards0 < num_microbatches_needed:
            another = forwards0 < num_microbatches_needed  # chunk 0 has micro-batches left
            order += [F0] * another + [B0, W0, F1, B1, W1]
            forwards0, forwards1 = forwards0 + another, forwards1 + 1
        # Cool-down: the backwards left, W's deferred into the slots where the pipeline drains.
        order += [B0, B1] * rank + [B0, W0] * (num_ranks - rank)
        order += [W1] * (order.count(B1) - order.count(W1)) + [W0] * (order.count(B0) - order.count(W0))
        tables.append(_number(order, num_microbatches))
    return tables


def dualpipev(num_ranks, num_microbatches):
    """DeepSeek's DualPipeV (PyTorch's ScheduleDualPipeV), two chunks placed as a V, in the paper's eight phases.
    An overlapped F&B step (O) is its forward, then an "overlapped_backward": a full backward that receives its
    gradient before the forward begins and sends its result with the forward's. PyTorch needs m >= 2n; fewer: holes."""
    _check(num_ranks, num_microbatches)
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
        order += [W, I0] * (n - rank - 1)  # nWB0: a W in each wait for the next B0
        order += [W] * (rank + 1)  # nW: the W's left
        tables.append(_number(order, num_microbatches))
    return tables


def looped_bfs(num_ranks, num_microbatches, num_chunks):
    """PyTorch's ScheduleLoopedBFS (breadth first): every micro-batch through chunk 0, then chunk 1, ...; then the
    backwards, the last chunk and the last micro-batch first. Loop placement."""
    _check(num_ranks, num_microbatches, num_chunks)
    order = [("forward", chunk, i) for chunk in range(num_chunks) for i in range(num_microbatches)]
    order += [("full_backward", chunk, i) for _, chunk, i in reversed(order)]  # the forwards, undone in reverse
    return [list(order) for _ in range(num_ranks)]


def interleaved_zero_bubble(num_ranks, num_microbatches, num_chunks):
    """PyTorch's ScheduleInterleavedZeroBubble (ZB1P): interleaved 1F1B in PyTorch's rounds, one warm-up forward
    per hop to the last rank, not two, and each backward split, its W run r backwards later. Loop placement."""
    _check(num_ranks, num_microbatches, num_chunks)
    # PyTorch's microbatches_per_round; where it does not divide m (PyTorch refuses those m), holes
    group_size = num_microbatches // max(1, num_microbatches // num_ranks)
    tables = []
    for rank in range(num_ranks):
        num_warmup_microbatches = (num_chunks - 1) * group_size + num_ranks - rank - 1
        tables.append(_split(_interleaved(num_microbatches, num_chunks, group_size, num_warmup_microbatches), rank))
    return tables


SCHEDULES = {  # name, as --schedule takes it: (function, placement)
    "gpipe": (gpipe, "loop"),
    "1f1b": (one_f_one_b, "loop"),
    "interleaved-1f1b": (interleaved_1f1b, "loop"),
    "zb-h1": (zb_h1, "loop"),
    "zbv": (zbv, "v"),
    "dualpipev": (dualpipev, "v"),
    "looped-bfs": (looped_bfs, "loop"),
    "interleaved-zero-bubble": (interleaved_zero_bubble, "loop"),
}


def _function(name):
    if name not in SCHEDULES:
        raise ValueError(f"There is no schedule named {name!r}: pass one of {', '.join(SCHEDULES)}.")
    return SCHEDULES[name][0]


def takes_virtual_stages(name):
    """Whether the schedule takes num_chunks, the model chunks per rank (the V ones always hold two)."""
    return "num_chunks" in inspect.signature(_function(name)).parameters


def table(name, num_ranks, num_microbatches, num_chunks=2):
    """Every rank's computations in order for the schedule `name`; num_chunks goes to the schedules that take it."""
    chunks = (num_chunks,) if takes_virtual_stages(name) else ()
    return _function(name)(num_ranks, num_microbatches, *chunks)


def _made_ready(kind, stage, micro_batch, num_stages):
    """The computations a finished one gives an input to: a forward, the next stage's forward (the last stage's: its
    own backward); a backward, its W and the previous stage's backward."""
    if kind == "forward":
        return [("forward", stage + 1, micro_batch) if stage < num_stages - 1 else ("backward", stage, micro_batch)]
    if kind == "backward":
        return [("weight", stage, micro_batch)] + [("backward", stage - 1, micro_batch)] * (stage > 0)
    return []


def _may_take(owing, micro_batch, visits, held, limit):
    """Whether a rank holding `held` of its `limit` slots may run micro_batch's next forward (the banker's rule): a
    slot is free, and afterwards it can still run every forward it owes. owing: for each micro-batch begun there
    and not through, the forwards it has left there of the `visits` it makes. Each forward takes a slot; a
    micro-batch lets its slots go only after its last forward here (its backwards need them all), so those with
    the fewest left are counted through first."""
    if held >= limit:
        return False
    after = {**owing, micro_batch: owing.get(micro_batch, visits) - 1}
    lefts = sorted(left for left in after.values() if left)
    free = limit - sum(visits - left for left in lefts)  # those through will let theirs go
    for left in lefts:
        if left > free:
            return False
        free += visits - left
    return True


def _greedy(rank_of, num_microbatches, chunk_cost, limit):
    """The search's first order, found as if messages were free (the passes reorder it with them).
    A free rank runs the ready computation it prefers: a B that a neighbour waits for (any but stage 0's) before an
    F, except right after a B, when an F comes first (1F1B), a W before it if memory is full; then stage 0's B; then
    a W. Of a rank's stages, F's of the higher and B's of the lower first: their micro-batches are older. An F runs
    only if the rank can still run every F it owes afterwards (_may_take). rank_of[stage]: the stage's rank, a
    stage here a chunk; chunk_cost: a chunk's cost of each kind. Returns (span, starts, orders), a computation as
    (kind, stage, micro_batch), or None if it deadlocks."""
    num_ranks, num_stages = 1 + max(rank_of), len(rank_of)
    visits = [rank_of.count(rank) for rank in range(num_ranks)]  # the stages a micro-batch passes on a rank
    owing = [{} for _ in range(num_ranks)]  # per rank, micro-batch: the forwards it has left there, if any
    ready = [{} for _ in range(num_ranks)]  # per rank, (kind, stage): heap of (when its input is in, micro_batch)
    ready[0]["forward", 0] = [(0.0, micro_batch) for micro_batch in range(num_microbatches)]
    events = [(0.0, 0)]  # (when, rank): a rank to look at then
    clock = [0.0] * num_ranks  # when each rank is free
    held = [0] * num_ranks  # (chunk, micro_batch) pairs each rank holds
    after_backward = [False] * num_ranks  # whether its last F or B was a B: 1F1B's turn
    starts, orders = {}, [[] for _ in range(num_ranks)]  # what the search returns
    while events:
        now, rank = heapq.heappop(events)
        if clock[rank] > now:
            continue
        arrived = {key: heap[0] for key, heap in ready[rank].items() if heap and heap[0][0] <= now}
        fits = {stage: _may_take(owing[rank], micro_batch, visits[rank], held[rank], limit)
                for (kind, stage), (_, micro_batch) in arrived.items() if kind == "forward"}
        room = after_backward[rank] and not all(fits.values())  # a W to make room for the F that 1F1B wants
        choices = []
        for (kind, stage), (arrival, micro_batch) in arrived.items():
            if kind == "forward" and fits[stage]:
                preference = 0 if after_backward[rank] else 1, -stage
            elif kind == "backward" and stage == 0:  # only its own W waits for it
                preference = 2, stage
            elif kind == "backward":
                preference = 1 if after_backward[rank] else 0, stage
            elif kind == "weight":
                preference = 0 if room else 3, 0
            else:
                continue
            choices.append((preference, arrival, micro_batch, kind, stage))
        if not choices:
            continue
        _, _, micro_batch, kind, stage = min(choices)
        heapq.heappop(ready[rank][kind, stage])
        starts[kind, stage, micro_batch] = now
        clock[rank] = now + chunk_cost[kind]
        orders[rank].append((kind, stage, micro_batch))
        heapq.heappush(events, (clock[rank], rank))
        held[rank] += (kind == "forward") - (kind == "weight")
        if kind == "forward":
            owing[rank][micro_batch] = owing[rank].get(micro_batch, visits[rank]) - 1
            if not owing[rank][micro_batch]:
                del owing[rank][micro_batch]
        if kind != "weight":  # a W keeps the 1F1B turn
            after_backward[rank] = kind == "backward"
        for next_kind, next_stage, _ in _made_ready(kind, stage, micro_batch, num_stages):
            next_rank = rank_of[next_stage]
            heapq.heappush(ready[next_rank].setdefault((next_kind, next_stage), []), (clock[rank], micro_batch))
            heapq.heappush(events, (clock[rank], next_rank))
    if len(starts) < 3 * num_microbatches * num_stages:
        return None
    return max(clock), starts, orders


def _reschedule(rank_of, starts, chunk_cost, message, limit, reverse):
    """One pass: a free rank runs the ready computation that began first in the last schedule, but waits for one that
    began sooner if it comes in before this would end, and takes memory (F's) in the last schedule's order. Reverse:
    the same on the graph reversed, time running back, the last to end first (a W takes memory, its F gives it back).
    Returns (span, starts, orders) forwards, or None if it deadlocks."""
    num_ranks, num_stages = 1 + max(rank_of), len(rank_of)
    key = {node: -start - chunk_cost[node[0]] if reverse else start for node, start in starts.items()}
    after, inputs = {node: [] for node in key}, dict.fromkeys(key, 0)  # inputs: how many are still to come
    for node in key:
        for made in _made_ready(*node, num_stages):
            after[made if reverse else node].append(node if reverse else made)
            inputs[node if reverse else made] += 1
    take, give = ("weight", "forward") if reverse else ("forward", "weight")
    takers = [[] for _ in range(num_ranks)]  # per rank, the computations that take memory, in the last order
    for node in sorted((node for node in key if node[0] == take), key=key.get):
        takers[rank_of[node[1]]].append(node)
    ready = [[] for _ in range(num_ranks)]  # per rank, a heap of (key, when its inputs are in, computation)
    parked = set()  # computations whose inputs are in, waiting for their turn to take memory
    events = []  # (when, rank): a rank to look at then
    arrival = dict.fromkeys(key, 0.0)  # when each computation's last input is in
    clock = [0.0] * num_ranks  # when each rank is free
    held = [0] * num_ranks  # memory each rank holds, counted in the direction of the pass
    taken = [0] * num_ranks  # how many of its takers each rank has run
    times, orders = {}, [[] for _ in range(num_ranks)]  # what the pass returns

    def arrive(node):
        """Its inputs are in: to its rank's heap, or parked while it is not the next to take memory."""
        rank = rank_of[node[1]]
        if node[0] == take and takers[rank][taken[rank]] != node:
            parked.add(node)
        else:
            heapq.heappush(ready[rank], (key[node], arrival[node], node))
            heapq.heappush(events, (arrival[node], rank))

    for node in key:
        if not inputs[node]:
            arrive(node)
    while events:
        now, rank = heapq.heappop(events)
        if clock[rank] > now:
            continue
        skipped, pick, sooner = [], None, None
        while ready[rank] and pick is None:
            skipped.append(heapq.heappop(ready[rank]))
            _, when, node = skipped[-1]
            if node[0] == take and held[rank] == limit:
                continue
            if when <= now:
                pick = skipped.pop()
            elif sooner is None:
                sooner = when  # it began sooner last time
        for item in skipped:
            heapq.heappush(ready[rank], item)
        if pick is None:
            continue
        if sooner is not None and sooner < now + chunk_cost[pick[2][0]]:  # it comes in before pick would end
            heapq.heappush(ready[rank], pick)
            heapq.heappush(events, (sooner, rank))
            continue
        node = pick[2]
        times[node] = now
        clock[rank] = now + chunk_cost[node[0]]
        orders[rank].append(node)
        heapq.heappush(events, (clock[rank], rank))
        held[rank] += (node[0] == take) - (node[0] == give)
        taken[rank] += node[0] == take
        if node[0] == take and taken[rank] < len(takers[rank]) and takers[rank][taken[rank]] in parked:
            parked.remove(takers[rank][taken[rank]])
            arrive(takers[rank][taken[rank]])
        for made in after[node]:
            inputs[made] -= 1
            arrival[made] = max(arrival[made], clock[rank] + (message if rank_of[made[1]] != rank else 0.0))
            if not inputs[made]:
                arrive(made)
    if len(times) < len(key):
        return None
    span = max(clock)
    if not reverse:
        return span, times, orders
    forward_times = {node: span - start - chunk_cost[node[0]] for node, start in times.items()}  # forwards again
    return span, forward_times, [order[::-1] for order in orders]


def _tables(orders):
    """Orders of (kind, stage, micro_batch) as tables of (kind, chunk, micro_batch): stage c n + r is chunk c on
    the loop, and on the V stage 2n - 1 - r is rank r's chunk 1."""
    return [[(kind, stage // len(orders), micro_batch) for kind, stage, micro_batch in order] for order in orders]


def _fastest_table(num_ranks, num_microbatches, placement, num_chunks, costs, limit, message):
    """The fastest table above of the placement and chunks that holds at most `limit` (chunk, micro_batch) pairs on
    any rank, each backward split (a gradient leaves sooner, and an overlapped F&B runs as its F then its B: no
    table is slower so), replayed: (simulation, tables), or None if none fits."""
    fastest, seen = None, []
    for name, (_, where) in SCHEDULES.items():
        if where != placement or (not takes_virtual_stages(name) and num_chunks != 1 + (where == "v")):
            continue
        try:
            tables = table(name, num_ranks, num_microbatches, num_chunks)
        except ValueError:  # DualPipeV on one rank
            continue
        if tables in seen:  # looped BFS at one chunk is GPipe
            continue
        if max(theory.peak_inflight(tables)) > limit:
            continue
        seen.append(tables)
        tables = [_split(order, 0) for order in tables]
        simulation = theory.simulate(tables, placement, num_chunks, costs, message)
        if fastest is None or simulation.step < fastest[0].step:
            fastest = simulation, tables
    return fastest


def _search(num_ranks, num_microbatches, placement, num_chunks, costs, limit, message):
    """search's table on one placement, and a bound on its step (its replay is no longer): (step, tables), or None
    if no order was found. It stops as soon as an order takes theory.least_step: none is faster."""
    rank_of = [0] * num_ranks * num_chunks
    for rank in range(num_ranks):
        for chunk in range(num_chunks):
            rank_of[theory.stage(placement, num_ranks, rank, chunk)] = rank
    chunk_cost = {kind: costs[kind] / num_chunks for kind in ("forward", "backward", "weight")}
    least = theory.least_step(placement, num_ranks, num_chunks, num_microbatches, costs, message, limit)
    best = math.inf, None  # the fastest order met: (step, tables)
    greedy = _greedy(rank_of, num_microbatches, chunk_cost, limit)
    if greedy:
        span, starts, orders = greedy
        tables = _tables(orders)
        if message:  # the greedy ignored messages: replay its order with them
            span = theory.simulate(tables, placement, num_chunks, costs, message).step
        best = span, tables
        if best[0] > least:
            best = _passes(rank_of, starts, chunk_cost, message, limit, best)
    fastest = None if best[0] <= least else _fastest_table(num_ranks, num_microbatches, placement, num_chunks,
                                                            costs, limit, message)
    if fastest and fastest[0].step < best[0]:  # a table that fits is faster: go on from it
        simulation, tables = fastest
        best = simulation.step, tables
        spans = simulation.spans.items()
        starts = {(kind, stage, micro_batch): start for (stage, kind, micro_batch), (start, _) in spans}
        if best[0] > least:
            best = _passes(rank_of, starts, chunk_cost, message, limit, best)
    return None if best[1] is None else best


def _passes(rank_of, starts, chunk_cost, message, limit, best):
    """best, (step, tables), or an order faster still from a pass backwards from these starts or the pass forwards
    from its result (_reschedule)."""
    for reverse in (True, False):
        result = _reschedule(rank_of, starts, chunk_cost, message, limit, reverse)
        if result is None:
            break
        span, starts, orders = result
        if span < best[0]:
            best = span, _tables(orders)
    return best


def _limit(num_ranks, num_microbatches, placement, num_chunks, memory):
    """The (chunk, micro_batch) pairs a rank may hold within `memory` micro-batches of a stage, or one sentence."""
    _check(num_ranks, num_microbatches, num_chunks)
    if placement not in ("loop", "v"):
        raise ValueError(f"placement is {placement!r}: pass 'loop' (one chunk a rank) or 'v' (two).")
    if placement == "v" and num_chunks != 2:
        raise ValueError(f"num_chunks is {num_chunks}: the V holds 2 chunks a rank.")
    if not memory >= 1:
        raise ValueError(f"memory is {memory!r}: no schedule runs in less than 1 micro-batch of a stage a rank.")
    return int(min(memory, num_microbatches) * num_chunks + 1e-9)


def search(num_ranks, num_microbatches, placement, costs, memory, message=0.0, num_chunks=None):
    """A table found, not written, in the spirit of the zero-bubble paper: each rank's forward, backward and weight
    computations (every backward split) for num_ranks ranks placed "loop" (num_chunks a rank, 1 unless given) or
    "v" (two), at a stage's costs {"forward": F, "backward": B, "weight": W} (a chunk's: a 1/num_chunks share) and a
    tensor's `message` time between ranks. memory: the most activations a rank may hold, in micro-batches of a stage
    (a chunk's: a 1/num_chunks share), as tools/plan.py counts them. A greedy gives the first order (_greedy), a
    pass backwards and one forwards (_reschedule) may shorten it; then, if it is faster, the fastest table above
    of the placement and chunks that fits the memory is a start too, rescheduled the same way. The fastest order
    met is kept: never slower than a table that fits. Any that takes theory.least_step ends the search, since no
    order is faster. Below memory 1 no schedule runs: a rank holds a micro-batch from its F to its W."""
    if num_chunks is None:
        num_chunks = 2 if placement == "v" else 1
    limit = _limit(num_ranks, num_microbatches, placement, num_chunks, memory)
    found = _search(num_ranks, num_microbatches, placement, num_chunks, costs, limit, message)
    if found is None:
        raise ValueError(f"no order of {num_chunks} chunks a rank was found within memory {memory}: allow more.")
    return found[1]


def best_search(num_ranks, num_microbatches, costs, memory, message=0.0, num_chunks=1, most_chunks=None):
    """search on each placement: the loop at one chunk a rank, the loop at num_chunks if more, the V, each if it
    holds at most most_chunks a rank (a model of L layers holds L // n). The fastest, the first of those on a tie,
    as tools/plan.py and 09's --schedule search find it: (placement, chunks, tables). A placement whose
    theory.least_step is no shorter than a table already found is not searched: it could only tie."""
    best = None  # (step, placement, chunks, tables)
    for placement, chunks in [("loop", 1)] + [("loop", num_chunks)] * (num_chunks > 1) + [("v", 2)]:
        if most_chunks is not None and chunks > most_chunks:
            continue
        limit = _limit(num_ranks, num_microbatches, placement, chunks, memory)
        if best and theory.least_step(placement, num_ranks, chunks, num_microbatches, costs, message, limit) >= best[0]:
            continue
        found = _search(num_ranks, num_microbatches, placement, chunks, costs, limit, message)
        if found and (best is None or found[0] < best[0]):
            best = found[0], placement, chunks, found[1]
    if best is None:
        raise ValueError(f"no order was found within memory {memory}: allow more.")
    return best[1:]
