"""The theory the runs are compared against: closed forms (*_bubble, *_inflight, a unit a computation) and a table's
replay (replay, bubbles, peak_inflight) that checks them. A computation: (kind, chunk, micro_batch) in a table."""

import itertools
import math

# F, I (a split backward's input gradient) and W one unit each: a full backward (B), I then W, two
UNIT_COSTS = {"forward": 1.0, "backward": 1.0, "weight": 1.0, "full_backward": 2.0, "overlapped_backward": 2.0}
UNIT_SPANS = dict.fromkeys(UNIT_COSTS, 1.0)  # every span one unit, as --pace makes them: a full backward is one span
BACKWARDS = ("backward", "full_backward", "overlapped_backward")  # the kinds that send a gradient back


def stage(placement, num_ranks, rank, chunk):
    """The stage that chunk `chunk` of rank `rank` holds: chunk c n + r ("loop"), or r and 2n - 1 - r ("v")."""
    return chunk * num_ranks + rank if placement == "loop" else (rank, 2 * num_ranks - 1 - rank)[chunk]


def counted_costs(blocks, hidden, classes):
    """Each stage's cost of a micro-batch, {kind: cost}, counted in multiply-adds, in units of one block's forward
    (a row through a hidden x hidden matrix). blocks: each stage's blocks; the last stage also holds the head, a
    hidden x classes matrix, and the loss, about one operation a class. A block's F, I (the input's gradient) and
    W (the weight's) each cost one; the head's each hidden x classes; the loss adds a class's worth to F and I.
    (The first block's I is counted too, though nothing needs its input's gradient.)"""
    head, loss = classes / hidden, classes / hidden**2
    costs = []
    for stage, count in enumerate(blocks):
        has_head = stage == len(blocks) - 1
        forward, weight = count + has_head * (head + loss), count + has_head * head
        costs.append({"forward": forward, "backward": forward, "weight": weight, "full_backward": forward + weight,
                      "overlapped_backward": forward + weight})
    return costs


def paced_spans(costs, unit=UNIT_SPANS):
    """Each stage's spans under --pace, in paces: every span of a stage lasts its F + I + W over the mean stage's,
    so that stages of equal cost are one pace each and a stage twice the mean two. unit: a kind's spans (a full
    backward is one span where a script runs it as one, UNIT_SPANS, and two where it runs I then W, UNIT_COSTS)."""
    mean = sum(map(_total, costs)) / len(costs)
    return [{kind: spans * _total(cost) / mean for kind, spans in unit.items()} for cost in costs]


def _per_stage(cost, num_stages):
    """cost as one {kind: cost} for each stage: it is one already, or the same for all."""
    return cost if isinstance(cost, list) else [cost] * num_stages


def replay(tables, stage_of, num_stages, cost=UNIT_COSTS, message=0.0, overlap=1.0):
    """When each computation starts and ends if every rank runs its table of (kind, chunk, micro_batch) in order,
    a computation takes cost[kind] (or cost[stage][kind], a list of each stage's) and a tensor from another rank
    `message` more: a forward waits for the previous
    stage's, an I or a full backward (plain or overlapped) for the next stage's (the last stage's for its own
    forward), a W for its I. A forward and the overlapped backward after it are one step: it begins once both
    inputs are in, lasts `overlap` of its two parts (1: one after the other; least_overlap: the most they can hide
    in each other), and both results leave at its end. stage_of(rank, chunk) places the chunks.
    Returns {(kind, stage, micro_batch): (start, when its result is out)}; one that cannot run (nor any after it
    on its rank) is missing."""
    rank_of = {stage_of(rank, chunk): rank for rank, table in enumerate(tables) for _, chunk, _ in table}
    costs = _per_stage(cost, num_stages)
    placed = [_placed(table, rank, stage_of, costs, overlap) for rank, table in enumerate(tables)]
    ends, spans, clock, position = {}, {}, [0.0] * len(tables), [0] * len(tables)

    def ready(rank, kind, stage, micro_batch):
        """When the input of one computation is in, or None while it is not yet made."""
        if kind == "forward":
            needed = "forward", stage - 1, micro_batch
        elif kind == "weight":
            needed = "backward", stage, micro_batch
        else:  # an I or a B: the next stage's, or on the last stage its own forward
            needed = ("backward", stage + 1, micro_batch) if stage < num_stages - 1 else ("forward", stage, micro_batch)
        if needed[1] < 0:  # the data
            return 0.0
        if needed not in ends:
            return None
        return ends[needed] + (message if rank_of[needed[1]] != rank else 0.0)

    progress = True
    while progress:
        progress = False
        for rank, rank_steps in enumerate(placed):
            while position[rank] < len(rank_steps):
                step, lasts = rank_steps[position[rank]]
                inputs = [ready(rank, kind, stage, micro_batch) for kind, stage, micro_batch, _ in step]
                if None in inputs:
                    break  # an input is not made yet: another rank first
                start = max([clock[rank], *inputs])
                end = start + lasts
                for kind, stage, micro_batch, its_cost in step:
                    spans[kind, stage, micro_batch] = start, end  # its result is out at the step's end
                    made = "forward" if kind == "forward" else "weight" if kind == "weight" else "backward"
                    ends[made, stage, micro_batch] = end
                    start += its_cost
                clock[rank] = end
                position[rank] += 1
                progress = True
    return spans


def bubbles(tables, stage_of, num_stages, cost=UNIT_COSTS, message=0.0, overlap=1.0):
    """Each rank's bubble when its table is replayed at cost[kind] (or cost[stage][kind]) a computation and an F&B
    step at `overlap` of its parts: the share of the pipeline's span, from the first start to the last end, that the
    rank spends idle."""
    length = max(end for _, end in replay(tables, stage_of, num_stages, cost, message, overlap).values())
    return [1 - busy / length for busy in computing(tables, stage_of, num_stages, cost, overlap)]


def computing(tables, stage_of, num_stages, cost=UNIT_COSTS, overlap=1.0):
    """Each rank's time computing, its table at cost[kind] (or cost[stage][kind]) a computation, an F&B step
    (a forward and the overlapped backward after it) at `overlap` of its two parts."""
    costs = _per_stage(cost, num_stages)
    return [sum(lasts for _, lasts in _placed(table, rank, stage_of, costs, overlap))
            for rank, table in enumerate(tables)]


def least_overlap(tables, stage_of, num_stages, cost=UNIT_COSTS):
    """The least `overlap` (replay) of these tables' F&B steps: the most that any step's longer part is of its two,
    where they hide in each other entirely; 0 if no step pairs two."""
    costs = _per_stage(cost, num_stages)
    least = 0.0
    for rank, table in enumerate(tables):
        for step in steps(table):
            parts = _parts(step, rank, stage_of, costs)
            if len(parts) == 2:
                least = max(least, max(parts) / sum(parts))
    return least


def _parts(step, rank, stage_of, costs):
    """The costs of a step's computations on this rank, at each stage's costs: one, or an F&B step's two."""
    return [costs[stage_of(rank, chunk)][kind] for kind, chunk, _ in step]


def _placed(table, rank, stage_of, costs, overlap):
    """A rank's table as its steps (_step), each a list of (kind, stage, micro_batch, cost) and how long it lasts:
    its computation's cost, or `overlap` of an F&B step's two parts. What replay and computing read, worked out once."""
    stages = {chunk: stage_of(rank, chunk) for _, chunk, _ in table}
    placed = []
    for step in steps(table):
        computations = [(kind, stages[chunk], micro_batch, costs[stages[chunk]][kind])
                        for kind, chunk, micro_batch in step]
        parts = [part for *_, part in computations]
        placed.append((computations, overlap * sum(parts) if len(parts) == 2 else parts[0]))
    return placed


def _step(table, position):
    """The step a rank runs from this position of its table: a computation, or a forward and the overlapped
    backward after it (an F&B step)."""
    pair = table[position:position + 2]
    return pair if pair[-1][0] == "overlapped_backward" else pair[:1]


def steps(table):
    """A table's steps in order (_step)."""
    position = 0
    while position < len(table):
        step = _step(table, position)
        yield step
        position += len(step)


def busiest_bubble(tables, stage_of, num_stages, cost=UNIT_COSTS, message=0.0):
    """The bubble of the rank that computes longest (the first such): what a script's bubble_theory means."""
    busy = computing(tables, stage_of, num_stages, cost)
    return bubbles(tables, stage_of, num_stages, cost, message)[busy.index(max(busy))]


def balanced(num_layers, tables, stage_of, num_stages, hidden, classes, budget=200_000, exhaustive=None,
             costs_of=None):
    """Each stage's blocks: the contiguous split of num_layers whose table, replayed at counted_costs, takes the
    least step, of those the most even (its costliest stages least, in turn); every stage holds a block but the
    last, which may hold the head alone. Every split is tried where splits times computations are at most
    `budget` (about a second of replays), or as `exhaustive` says (True or False). Otherwise the method is exact
    on the slowest rank: each count of blocks on the head's rank, the rest shared out evenly over the ranks and
    within a rank over its chunks (the head's chunk the fewest), is costed by its costliest rank; the replay
    chooses among the counts whose costliest rank costs least and one block either side; then a block moves
    from one stage to another while that shortens the step, as long as the same budget of replays lasts.
    costs_of(blocks): each stage's costs for a split, if not counted_costs (tools/plan.py's from a trace)."""
    if costs_of is None:
        def costs_of(blocks):
            return counted_costs(blocks, hidden, classes)

    def step(blocks):  # and each stage's F + I + W, costliest first: the split most even among equal steps
        costs = costs_of(blocks)
        spans = replay(tables, stage_of, num_stages, costs)
        return round(max(end for _, end in spans.values()), 9), sorted((_total(cost) for cost in costs), reverse=True)

    computations = sum(map(len, tables))
    if exhaustive is None:
        exhaustive = num_stages == 1 or math.comb(num_layers, num_stages - 1) * computations <= budget
    if exhaustive:
        return min(_splits(num_layers, num_stages), key=step)
    chunks = [sorted(stage_of(rank, chunk) for chunk in {chunk for _, chunk, _ in table})
              for rank, table in enumerate(tables)]
    head = next(rank for rank, stages in enumerate(chunks) if num_stages - 1 in stages)

    def around(on_head):  # on_head blocks on the head's rank, the rest shared out evenly
        others = [rank for rank in range(len(tables)) if rank != head]
        base, leftover = divmod(num_layers - on_head, max(len(others), 1))
        blocks = [0] * num_stages
        for rank, count in [(head, on_head)] + [(rank, base + (index < leftover)) for index, rank in enumerate(others)]:
            stages = chunks[rank][::-1] if rank == head else chunks[rank]  # the head's chunk gets the fewest
            for index, stage in enumerate(stages):
                blocks[stage] = count // len(stages) + (index < count % len(stages))
        return blocks

    def costliest(blocks):
        costs = [_total(cost) for cost in costs_of(blocks)]
        return max(sum(costs[stage] for stage in stages) for stages in chunks)

    fits = [count for count in range(num_layers + 1) if all(around(count)[:-1]) and sum(around(count)) == num_layers]
    least = min(costliest(around(count)) for count in fits)
    near = {count + way for count in fits if costliest(around(count)) <= least * (1 + 1e-12) for way in (-1, 0, 1)}
    best = min((around(count) for count in sorted(near & set(fits))), key=step)
    budget = budget // computations - len(near)
    moved = True
    while moved and budget > 0:  # one block from one stage to another, while the step shortens
        moved = False
        for source, target in itertools.permutations(range(num_stages), 2):
            if budget <= 0:
                break
            blocks = list(best)
            blocks[source] -= 1
            blocks[target] += 1
            budget -= 1
            if all(blocks[:-1]) and blocks[-1] >= 0 and step(blocks) < step(best):
                best, moved = blocks, True
    return best


def _total(cost):
    """A stage's F + I + W for a micro-batch."""
    return cost["forward"] + cost["backward"] + cost["weight"]


def _splits(num_layers, num_stages):
    """Every split of num_layers blocks into num_stages contiguous stages, each holding one at least but the last:
    cut 0..num_layers + 1 at num_stages - 1 of the points between, and take the last stage's extra one off."""
    for cut in itertools.combinations(range(1, num_layers + 1), num_stages - 1):
        bounds = (0, *cut, num_layers + 1)
        blocks = [after - before for before, after in zip(bounds, bounds[1:])]
        blocks[-1] -= 1
        yield blocks


def peak_inflight(tables, weight_memory=1):
    """Each rank's most (chunk, micro_batch) pairs alive at once, counted over its table: +1 at a forward,
    -1 at its full backward, or at its W where the table splits the backward (at its I if no W follows).
    weight_memory: the share of a pair that its I leaves held until its W (M_W / M_B in the zero-bubble paper,
    which calls I 'B'; 1, the whole pair, unless given): an I lets go of the rest. Above 1 (this MLP's:
    tools/held.py, weight_share) an I adds to what its F held, and a full backward, its I then its W as 09 runs
    it, holds that much a moment."""
    peaks = []
    for table in tables:
        weights = {(chunk, micro_batch) for kind, chunk, micro_batch in table if kind == "weight"}
        alive = peak = 0
        for kind, chunk, micro_batch in table:
            if kind == "forward":
                alive += 1
            elif kind == "weight":
                alive -= weight_memory
            elif kind == "backward" and (chunk, micro_batch) in weights:  # its W keeps weight_memory of it
                alive -= 1 - weight_memory
            else:  # a full backward, or an I that no W follows: a moment with what an I adds, then nothing
                peak = max(peak, alive + max(0, weight_memory - 1))
                alive -= 1
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks


def naive_bubble(n):
    """01: one stage works at a time."""
    return (n - 1) / n


def gpipe_bubble(n, m):
    """02, 03, 07 and 08: n - 1 slots to fill the pipeline and n - 1 to drain it, around m forwards and m backwards."""
    return (n - 1) / (m + n - 1)


def zb_h1_bubble(n, m):
    """05, equal F, I and W: rank 0 waits 2n - 1 units for its first I; W's fill the rest (README, *Zero bubble*)."""
    return 1 - 3 * m / max(3 * m + n - 1, 2 * m + 2 * n - 1)


def zbv_bubble(n, m):
    """06, equal F, I and W: every rank computes 6m units of a span of 6m + n - 1, or, with too few
    micro-batches to fill the V, of 4m + 4n - 2."""
    return 1 - 6 * m / max(6 * m + n - 1, 4 * m + 4 * n - 2)


def one_f_one_b_inflight(n, m, rank):
    """03, 07 and 08 (05 from F to I): stage r runs n - r forwards before its first backward frees one."""
    return min(n - rank, m)


def interleaved_inflight(n, m, v, rank):
    """04: (micro-batch, chunk) pairs alive at rank's first backward, its peak: the forwards of its warm-up and
    the one before that backward, less the holes among them (position p runs micro-batch (p // nv) n + p % n)."""
    padded = -(-m // n) * n
    forwards = min((v - 1) * n + 2 * (n - rank - 1) + 1, padded * v)
    return sum((p // (n * v)) * n + p % n < m for p in range(forwards))


def zb_h1_inflight(n, m):
    """05, from F to W: 1F1B's n - r from F to I, and r W's deferred."""
    return min(n, m)


def zbv_inflight(n, m, rank):
    """06: at rank's first chunk-1 I, the chunk-0 forwards of its warm-up (2n - r - 1) and the chunk-1
    forwards before that I (r + 1), fewer if m is smaller."""
    return min(2 * n - rank - 1, m) + min(rank + 1, m)
