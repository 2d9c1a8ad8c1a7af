"""A table found, not written, in the spirit of the zero-bubble paper (sail-sg's scheduler/zb.py): the costs of F,
I (a split backward's input gradient, which the paper calls B) and W and a memory in, every rank's order out,
never slower than a table of schedules.py that fits that memory. tools/plan.py prints it and saves it as a CSV
that 09 runs.

search        the table for one placement: a greedy order (_greedy), passes that shorten it (_reschedule), the
              paper's heuristic (_warmed_up) and the tables that fit as other starts, the best by the objective
best_search   search on each placement (the loop at one chunk a rank and at more, the V): the best

A computation is (kind, stage, micro_batch) here, a chunk being a stage: one rank may hold several.
"""

import heapq
import math

import schedules
import theory
from tools import costs


def _users_of(kind, stage, micro_batch, num_stages):
    """The computations a finished one gives an input to: a forward, the next stage's forward (the last stage's: its
    own I); an I, its W and the previous stage's I."""
    if kind == "forward":
        return [("forward", stage + 1, micro_batch) if stage < num_stages - 1 else ("backward", stage, micro_batch)]
    if kind == "backward":
        return [("weight", stage, micro_batch)] + [("backward", stage - 1, micro_batch)] * (stage > 0)
    return []


def _forward_fits(owing, micro_batch, visits, held, limit):
    """Whether a rank holding `held` of its `limit` slots may run micro_batch's next forward (the banker's rule): a
    slot is free, and afterwards it can still run every forward it owes. owing: for each micro-batch begun there
    and not through, the forwards it has left there of the `visits` it makes. Each forward takes a slot; a
    micro-batch lets its slots go only after its last forward here (its I's need them all; what an I leaves
    for its W, W can always let go), so those with the fewest left are counted through first."""
    if held + 1 > limit + 1e-9:
        return False
    after = {**owing, micro_batch: owing.get(micro_batch, visits) - 1}
    lefts = sorted(left for left in after.values() if left)
    free = limit - sum(visits - left for left in lefts)  # those through will let theirs go
    for left in lefts:
        if left > free:
            return False
        free += visits - left
    return True


def _held_by(kind, weight_memory):
    """What a computation adds to its rank's held pairs: a forward one, an I all but the weight_memory share its W
    keeps, that W the rest."""
    return {"forward": 1, "backward": weight_memory - 1, "weight": -weight_memory}[kind]


def _forward_limit(limit, weight_memory):
    """The pairs a rank's F's may fill: all of `limit`, or, where an I adds to what its F held (weight_memory above 1,
    this MLP's), all but what an I adds, so that an I always fits once the W's it owes have run."""
    return limit - max(0, weight_memory - 1)


def _greedy(rank_of, num_microbatches, chunk_cost, limit, weight_memory):
    """The search's first order, found as if messages were free (the passes reorder it with them).
    A free rank runs the ready computation it prefers: an I that a neighbour waits for (any but stage 0's) before an
    F, except right after an I, when an F comes first (1F1B), a W before it if memory is full; then stage 0's I; then
    a W. Of a rank's stages, F's of the higher and I's of the lower first: their micro-batches are older. An F runs
    only if the rank can still run every F it owes afterwards (_forward_fits). rank_of[stage]: the stage's rank, a
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
    forward_limit, input_grad_adds = _forward_limit(limit, weight_memory), _held_by("backward", weight_memory)
    after_input_grad = [False] * num_ranks  # whether its last F or I was an I: 1F1B's turn
    starts, orders = {}, [[] for _ in range(num_ranks)]  # what the search returns
    while events:
        now, rank = heapq.heappop(events)
        if clock[rank] > now:
            continue
        arrived = {key: heap[0] for key, heap in ready[rank].items() if heap and heap[0][0] <= now}
        fits = {stage: _forward_fits(owing[rank], micro_batch, visits[rank], held[rank], forward_limit)
                for (kind, stage), (_, micro_batch) in arrived.items() if kind == "forward"}
        room = after_input_grad[rank] and not all(fits.values())  # a W to make room for the F that 1F1B wants
        choices = []
        for (kind, stage), (arrival, micro_batch) in arrived.items():
            if kind == "forward" and fits[stage]:
                preference = 0 if after_input_grad[rank] else 1, -stage
            elif kind == "backward" and held[rank] + input_grad_adds > limit + 1e-9:  # its W's owed first
                continue
            elif kind == "backward" and stage == 0:  # only its own W waits for it
                preference = 2, stage
            elif kind == "backward":
                preference = 1 if after_input_grad[rank] else 0, stage
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
        held[rank] += _held_by(kind, weight_memory)
        if kind == "forward":
            owing[rank][micro_batch] = owing[rank].get(micro_batch, visits[rank]) - 1
            if not owing[rank][micro_batch]:
                del owing[rank][micro_batch]
        if kind != "weight":  # a W keeps the 1F1B turn
            after_input_grad[rank] = kind == "backward"
        for next_kind, next_stage, _ in _users_of(kind, stage, micro_batch, num_stages):
            next_rank = rank_of[next_stage]
            heapq.heappush(ready[next_rank].setdefault((next_kind, next_stage), []), (clock[rank], micro_batch))
            heapq.heappush(events, (clock[rank], next_rank))
    if len(starts) < 3 * num_microbatches * num_stages:
        return None
    return max(clock), starts, orders


def _reschedule(rank_of, starts, chunk_cost, message, limit, weight_memory, reverse):
    """One pass: a free rank runs the ready computation that began first in the last schedule, but waits for one that
    began sooner if it comes in before this would end, and takes memory (F's) in the last schedule's order. Reverse:
    the same on the graph reversed, time running back, the last to end first (a W takes memory, and an I what its W
    does not keep; its F gives it back). Returns (span, starts, orders) forwards, or None if it deadlocks."""
    num_ranks, num_stages = 1 + max(rank_of), len(rank_of)
    key = {node: -start - chunk_cost[node[0]] if reverse else start for node, start in starts.items()}
    after, inputs = {node: [] for node in key}, dict.fromkeys(key, 0)  # inputs: how many are still to come
    for node in key:
        for made in _users_of(*node, num_stages):
            after[made if reverse else node].append(node if reverse else made)
            inputs[node if reverse else made] += 1
    take = "weight" if reverse else "forward"
    forward_limit = _forward_limit(limit, weight_memory)
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
            taking = _held_by(node[0], weight_memory) * (-1 if reverse else 1)
            bound = forward_limit if node[0] == "forward" else limit
            if taking > 0 and held[rank] + taking > bound + 1e-9:
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
        held[rank] += _held_by(node[0], weight_memory) * (-1 if reverse else 1)
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


def _warmed_up(num_ranks, num_microbatches, chunk_cost, message, limit, weight_memory, hold_back_f, fill_waits):
    """The zero-bubble paper's own heuristic (sail-sg's auto_schedule.py) on the loop at one chunk a rank, as a start:
    micro-batches in order, 1F1B after a warm-up in which each rank runs the F's that end before its first I's input
    can come (fewer than the rank below); a W only where memory needs it or while a rank would wait for an input,
    on rank 0 all those owed before each I once its F's are done, and the rest at the end. Each wait is allowed up
    to the longest idle met so far; past it a W fills it (fill_waits: always). hold_back_f: an F of a rank two ahead
    of the next one waits if it would delay that I's return. Returns the orders, or None if memory is too small."""
    cost, last = chunk_cost, num_ranks - 1
    held_by = {kind: _held_by(kind, weight_memory) for kind in cost}
    bound = {kind: _forward_limit(limit, weight_memory) if kind == "forward" else limit for kind in cost}
    ends = {}  # (kind, rank, micro_batch): when it ends
    clock, held, idle = [0.0] * num_ranks, [0.0] * num_ranks, [0.0] * num_ranks
    count = [dict.fromkeys(cost, 0) for _ in range(num_ranks)]  # per rank, how many of each kind it has run
    orders = [[] for _ in range(num_ranks)]

    def input_in(kind, rank):
        """When the input of the rank's next computation of this kind is in (its own inputs at no message)."""
        micro_batch = count[rank][kind]
        if kind == "forward":
            return ends["forward", rank - 1, micro_batch] + message if rank else 0.0
        if kind == "backward" and rank < last:
            return ends["backward", rank + 1, micro_batch] + message
        if kind == "backward":  # the last rank's: its own forward's
            return ends["forward", rank, micro_batch]
        return ends["backward", rank, micro_batch]

    def put(rank, kind):
        start = max(clock[rank], input_in(kind, rank))
        if count[rank]["forward"]:
            idle[rank] += start - clock[rank]
        clock[rank] = start + cost[kind]
        ends[kind, rank, count[rank][kind]] = clock[rank]
        orders[rank].append((kind, rank, count[rank][kind]))
        held[rank] += held_by[kind]
        count[rank][kind] += 1

    def owed(rank):
        return count[rank]["backward"] - count[rank]["weight"]

    def weights_before(rank, kind):
        """The W's the rank runs before its next computation of this kind: for memory, then into its wait."""
        while held[rank] + held_by[kind] > bound[kind] + 1e-9:
            if not owed(rank):
                raise ValueError("no W frees memory")
            put(rank, "weight")
        if (kind, rank) in (("forward", 0), ("backward", last)):  # its input is the rank's own
            return
        arrival = input_in(kind, rank)
        while owed(rank) and clock[rank] + cost["weight"] <= arrival:
            put(rank, "weight")
        if owed(rank) and clock[rank] < arrival and (fill_waits or arrival - clock[rank] > max(idle) - idle[rank]):
            put(rank, "weight")

    for rank in range(num_ranks):
        put(rank, "forward")
    warm_up = [0] * num_ranks  # the F's each rank runs before its first I, after micro-batch 0's
    input_grad_end = clock[last] + cost["backward"]
    for rank in range(last - 1, -1, -1):
        busy, holds = clock[rank], held[rank]
        while 1 + warm_up[rank] < num_microbatches and holds + 1 <= bound["forward"] + 1e-9 and \
                busy + cost["forward"] <= input_grad_end + message:
            busy, holds, warm_up[rank] = busy + cost["forward"], holds + 1, warm_up[rank] + 1
        input_grad_end = max(busy, input_grad_end + message) + cost["backward"]
    for rank in range(1, num_ranks):  # fewer than the rank below, unless it runs them all
        if 1 + warm_up[rank] < num_microbatches:
            warm_up[rank] = max(0, min(warm_up[rank], warm_up[rank - 1] - 1))
    try:
        for rank in range(num_ranks):
            for _ in range(warm_up[rank]):
                put(rank, "forward")
        for rank in range(last, -1, -1):
            weights_before(rank, "backward")  # none owed yet: only whether it fits
            put(rank, "backward")
        for _ in range(1, num_microbatches):
            wants = [count[rank]["forward"] < num_microbatches for rank in range(num_ranks)]
            for rank in range(last):
                if hold_back_f and wants[rank] and count[rank]["forward"] >= count[rank + 1]["forward"] + 2:
                    returns = clock[rank + 1] + cost["forward"] + cost["backward"] + message
                    over = held[rank] + 1 - bound["forward"] - 1e-9  # what an F more holds past its bound
                    freeing = min(owed(rank), max(0, math.ceil(over / weight_memory)))
                    late = clock[rank] + cost["forward"] + freeing * cost["weight"] > returns
                    allowed = returns - clock[rank] <= max(idle) - idle[rank]  # waiting instead is within the longest
                    wants[rank] = clock[rank] < returns and not (late and allowed)
            for rank in range(last - 1, -1, -1):  # a rank runs an F only if the next one does
                wants[rank] = wants[rank] and wants[rank + 1]
            for rank in range(num_ranks):
                if wants[rank]:
                    weights_before(rank, "forward")
                    put(rank, "forward")
            for rank in range(last, -1, -1):
                if rank == 0 and count[0]["forward"] == num_microbatches:
                    while owed(0):
                        put(0, "weight")
                weights_before(rank, "backward")
                put(rank, "backward")
    except ValueError:
        return None
    for rank in range(num_ranks):
        while owed(rank):
            put(rank, "weight")
    return orders


def _as_tables(orders):
    """Orders of (kind, stage, micro_batch) as tables of (kind, chunk, micro_batch): stage c n + r is chunk c on
    the loop, and on the V stage 2n - 1 - r is rank r's chunk 1."""
    return [[(kind, stage // len(orders), micro_batch) for kind, stage, micro_batch in order] for order in orders]


def _fastest_table(num_ranks, num_microbatches, placement, num_chunks, cost, limit, message, weight_memory):
    """The fastest table of schedules.py of the placement and chunks that holds at most `limit` (chunk, micro_batch)
    pairs on any rank, each B split into I and W (a gradient leaves sooner, and an overlapped F&B runs as its F then its
    I: no table is slower so), replayed: (simulation, tables), or None if none fits."""
    fastest, seen = None, []
    for name, (_, where) in schedules.SCHEDULES.items():
        if where != placement or (not schedules.takes_virtual_stages(name) and num_chunks != 1 + (where == "v")):
            continue
        try:
            tables = schedules.table(name, num_ranks, num_microbatches, num_chunks)
        except ValueError:  # DualPipeV on one rank
            continue
        if tables in seen:  # looped BFS at one chunk is GPipe
            continue
        seen.append(tables)
        tables = [schedules.split(order, 0) for order in tables]  # each W at once
        if max(theory.peak_inflight(tables, weight_memory)) > limit + 1e-9:
            continue
        simulation = costs.simulate(tables, placement, num_chunks, cost, message)
        if fastest is None or simulation.step < fastest[0].step:
            fastest = simulation, tables
    return fastest


def _search_placement(num_ranks, num_microbatches, placement, num_chunks, cost, limit, message, weight_memory=1,
                      objective="step"):
    """search's table on one placement: (key, step, tables), or None if no order was found. Every order met is replayed
    (costs.simulate) and keyed by the objective (_key); the least key wins. The starts: the greedy (_greedy) and
    the passes from it (_shortened); on the loop at one chunk a rank, the zero-bubble paper's heuristic
    (_warmed_up); the fastest table of schedules.py that fits (_fastest_table) and the passes from it. Judging by
    step, each start after the greedy is tried only while no order takes costs.least_step: none is faster."""
    rank_of = [0] * num_ranks * num_chunks
    for rank in range(num_ranks):
        for chunk in range(num_chunks):
            rank_of[theory.stage(placement, num_ranks, rank, chunk)] = rank
    chunk_cost = {kind: cost[kind] / num_chunks for kind in ("forward", "backward", "weight")}
    least = costs.least_step(placement, num_ranks, num_chunks, num_microbatches, cost, message, limit)
    work = num_microbatches * sum(cost[kind] for kind in ("forward", "backward", "weight"))
    met = []  # (key, step, tables) of every order met

    def meet(tables):
        simulation = costs.simulate(tables, placement, num_chunks, cost, message, weight_memory)
        met.append((_key(simulation, objective, work), simulation.step, tables))

    def reached():  # judging by step, an order that takes the least step
        return objective == "step" and bool(met) and min(met, key=lambda item: item[0])[1] <= least

    greedy = _greedy(rank_of, num_microbatches, chunk_cost, limit, weight_memory)
    if greedy:
        meet(_as_tables(greedy[2]))
        if not reached():
            for tables in _shortened(rank_of, greedy[1], chunk_cost, message, limit, weight_memory):
                meet(tables)
    if placement == "loop" and num_chunks == 1 and not reached():
        for hold_back_f in (True, False):
            for fill_waits in (True, False):
                orders = _warmed_up(num_ranks, num_microbatches, chunk_cost, message, limit, weight_memory,
                                    hold_back_f, fill_waits)
                if orders:
                    meet(_as_tables(orders))
    fastest = None if reached() else _fastest_table(num_ranks, num_microbatches, placement, num_chunks, cost, limit,
                                                    message, weight_memory)
    if fastest:  # a table that fits: go on from it too
        simulation, tables = fastest
        meet(tables)
        starts = {computation: start for computation, (start, _) in simulation.spans.items()}
        if not reached():
            for tables in _shortened(rank_of, starts, chunk_cost, message, limit, weight_memory):
                meet(tables)
    return min(met, key=lambda item: item[0]) if met else None


def _key(simulation, objective, work):
    """How the search compares orders: by step, the pipeline's span, then by the longest rank's window (the
    zero-bubble paper's measure, costs.Simulation.bubble_window), or by window then step; each rounded to 9 digits
    (the step as a share of a rank's work), so that orders equal but for rounding tie."""
    step, window = round(simulation.step / work, 9), round(simulation.bubble_window, 9)
    return (step, window) if objective == "step" else (window, step)


def _shortened(rank_of, starts, chunk_cost, message, limit, weight_memory):
    """The tables of a pass backwards from these starts and of the pass forwards from its result (_reschedule),
    while they do not deadlock."""
    for reverse in (True, False):
        result = _reschedule(rank_of, starts, chunk_cost, message, limit, weight_memory, reverse)
        if result is None:
            return
        _, starts, orders = result
        yield _as_tables(orders)


def _pair_limit(num_ranks, num_microbatches, placement, num_chunks, memory, weight_memory=1):
    """The (chunk, micro_batch) pairs a rank may hold within `memory` micro-batches of a stage, no more than every
    pair at once can (each at weight_memory after its I, where that is more), or one sentence."""
    schedules.check_counts(num_ranks, num_microbatches, num_chunks)
    if placement not in ("loop", "v"):
        raise ValueError(f"placement is {placement!r}: pass 'loop' (one chunk a rank) or 'v' (two).")
    if placement == "v" and num_chunks != 2:
        raise ValueError(f"num_chunks is {num_chunks}: the V holds 2 chunks a rank.")
    if not memory >= 1:
        raise ValueError(f"memory is {memory!r}: no schedule runs in less than 1 micro-batch of a stage a rank.")
    return min(memory, num_microbatches * max(1, weight_memory)) * num_chunks


def search(num_ranks, num_microbatches, placement, cost, memory, message=0.0, num_chunks=None, weight_memory=1,
           objective="step"):
    """A table found, not written, in the spirit of the zero-bubble paper: each rank's F, I and W computations (no
    full backward) for num_ranks ranks placed "loop" (num_chunks a rank, 1 unless given) or "v" (two), at a
    stage's costs {"forward": F, "backward": I, "weight": W} (a chunk's: a 1/num_chunks share) and a tensor's
    `message` time between ranks. memory: the most activations a rank may hold, in micro-batches of a stage
    (a chunk's: a 1/num_chunks share), as tools/plan.py counts them, an I leaving weight_memory of its micro-batch's
    held for its W (the zero-bubble paper's M_W / M_B; 1, all of it, unless given; above 1, this MLP's, an I adds to
    its count, and its F's leave it that room). The starts (_search_placement): a greedy (_greedy) and the passes
    backwards and forwards from it (_reschedule); on the loop at one chunk a rank, the zero-bubble paper's heuristic
    (_warmed_up); the fastest table of schedules.py that fits the memory. The best order met by the objective is
    kept ("step": the step, then the longest window; "window": the reverse, the paper's measure): never worse than a
    table that fits. Below memory 1 no schedule runs: a rank holds a micro-batch from F to W."""
    if num_chunks is None:
        num_chunks = 2 if placement == "v" else 1
    limit = _pair_limit(num_ranks, num_microbatches, placement, num_chunks, memory, weight_memory)
    found = _search_placement(num_ranks, num_microbatches, placement, num_chunks, cost, limit, message, weight_memory,
                              objective)
    if found is None:
        raise ValueError(f"no order of {num_chunks} chunks a rank was found within memory {memory}: allow more.")
    return found[2]


def best_search(num_ranks, num_microbatches, cost, memory, message=0.0, num_chunks=1, most_chunks=None,
                placements=("loop", "v"), weight_memory=1, objective="step"):
    """search on each placement of `placements`: the loop at one chunk a rank, the loop at num_chunks if more, the
    V, each if it holds at most most_chunks a rank (a model of L layers holds L // n). The fastest, the first of
    those on a tie, as tools/plan.py finds it (its --save, 09's --schedule FILE.csv): (placement, chunks, tables).
    Judging by step, a placement whose costs.least_step is no shorter than a table already found is not searched:
    it could only tie."""
    best = None  # (key, step, placement, chunks, tables)
    for placement, chunks in [("loop", 1)] + [("loop", num_chunks)] * (num_chunks > 1) + [("v", 2)]:
        if placement not in placements or most_chunks is not None and chunks > most_chunks:
            continue
        limit = _pair_limit(num_ranks, num_microbatches, placement, chunks, memory, weight_memory)
        least = costs.least_step(placement, num_ranks, chunks, num_microbatches, cost, message, limit)
        if best and objective == "step" and least >= best[1]:
            continue
        found = _search_placement(num_ranks, num_microbatches, placement, chunks, cost, limit, message, weight_memory,
                                  objective)
        if found and (best is None or found[0] < best[0]):
            best = *found[:2], placement, chunks, found[2]
    if best is None:
        raise ValueError(f"no order was found within memory {memory}: allow more.")
    return best[2:]
