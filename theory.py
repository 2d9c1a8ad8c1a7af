"""The theory every run is compared against, in one place: the scripts' summaries, the harness, the tests
and the tools import it. Plain Python: it imports nothing of the lesson.

stage         where a rank's chunk sits, on the loop or the V
replay        when each computation starts, and when its result is out, if each takes its cost; common.timetable
              follows it, and the harness replays a run's own order with it
bubbles       each rank's idle share of its pipeline's span, from a replay (busiest_bubble: the busiest rank's)
peak_inflight the (chunk, micro_batch) pairs a rank keeps alive at its peak, counted over its table
simulate      a table at a stage's costs (stage_costs, parse_costs): step, bubble, peaks, messages (tools/plan.py)
least_step    a step no order can beat, for schedules.search
*_bubble      the closed forms, every computation one unit: naive, GPipe and 1F1B, ZB-H1, ZB-V
*_inflight    the closed forms of the in-flight peaks
held_theory   each rank's peak held bytes, in micro-batch activations (docs/design.md, *Memory*);
held_count    the same counted over any table (06, 09)
"""

from typing import NamedTuple

UNIT = {"forward": 1.0, "backward": 1.0, "weight": 1.0, "full_backward": 2.0, "overlapped_backward": 2.0}  # B + W
SPANS = dict.fromkeys(UNIT, 1.0)  # every span one unit, as 01-06 pace them: their full backward is one span
BACKWARDS = ("backward", "full_backward", "overlapped_backward")  # the kinds that send a gradient back


def stage(placement, num_ranks, rank, chunk):
    """The stage that chunk `chunk` of rank `rank` holds: chunk c n + r ("loop"), or r and 2n - 1 - r ("v")."""
    return chunk * num_ranks + rank if placement == "loop" else (rank, 2 * num_ranks - 1 - rank)[chunk]


def replay(tables, stage_of, num_stages, cost=UNIT, message=0.0):
    """When each computation starts and ends if every rank runs its table of (kind, chunk, micro_batch) in order,
    a computation takes cost[kind] and a tensor from another rank `message` more: a forward waits for the previous
    stage's, a backward (split, full or overlapped) for the next stage's (the last stage's for its own forward), a
    weight gradient for its B. A forward and the overlapped backward after it are one step: it begins once both
    inputs are in, and both results leave at its end. stage_of(rank, chunk) places the chunks.
    Returns {(stage, kind, micro_batch): (start, when its result is out)}; one that cannot run (nor any after it
    on its rank) is missing."""
    rank_of = {stage_of(rank, chunk): rank for rank, table in enumerate(tables) for _, chunk, _ in table}
    ends, spans, clock, position = {}, {}, [0.0] * len(tables), [0] * len(tables)

    def ready(rank, kind, chunk, micro_batch):
        """When the input of one computation is in, or None while it is not yet made."""
        stage = stage_of(rank, chunk)
        if kind == "forward":
            needed = "forward", micro_batch, stage - 1
        elif kind == "weight":
            needed = "backward", micro_batch, stage
        else:  # a backward: the next stage's, or on the last stage its own forward
            needed = ("backward", micro_batch, stage + 1) if stage < num_stages - 1 else ("forward", micro_batch, stage)
        if needed[2] < 0:  # the data
            return 0.0
        if needed not in ends:
            return None
        return ends[needed] + (message if rank_of[needed[2]] != rank else 0.0)

    progress = True
    while progress:
        progress = False
        for rank, table in enumerate(tables):
            while position[rank] < len(table):
                pair = table[position[rank]:position[rank] + 2]
                step = pair if pair[-1][0] == "overlapped_backward" else pair[:1]  # F&B: one step
                inputs = [ready(rank, *computation) for computation in step]
                if None in inputs:
                    break  # an input is not made yet: another rank first
                start = max([clock[rank], *inputs])
                end = start + sum(cost[kind] for kind, _, _ in step)
                for kind, chunk, micro_batch in step:
                    stage = stage_of(rank, chunk)
                    spans[stage, kind, micro_batch] = start, end  # its result is out at the step's end
                    made = "forward" if kind == "forward" else "weight" if kind == "weight" else "backward"
                    ends[made, micro_batch, stage] = end
                    start += cost[kind]
                clock[rank] = end
                position[rank] += len(step)
                progress = True
    return spans


def bubbles(tables, stage_of, num_stages, cost=UNIT, message=0.0):
    """Each rank's bubble when its table is replayed at cost[kind] a computation: the share of the
    pipeline's span, from the first start to the last end, that the rank spends idle."""
    length = max(end for _, end in replay(tables, stage_of, num_stages, cost, message).values())
    return [1 - sum(cost[kind] for kind, _, _ in table) / length for table in tables]


def busiest_bubble(tables, stage_of, num_stages, cost=UNIT, message=0.0):
    """The bubble of the rank that computes longest (the first such): what a script's bubble_theory means."""
    busiest = max(range(len(tables)), key=lambda rank: sum(cost[kind] for kind, _, _ in tables[rank]))
    return bubbles(tables, stage_of, num_stages, cost, message)[busiest]


def peak_inflight(tables):
    """Each rank's most (chunk, micro_batch) pairs alive at once, counted over its table: +1 at a forward,
    -1 at its full backward, or at its W where the table splits the backward (at its B if no W follows)."""
    peaks = []
    for table in tables:
        weights = {(chunk, micro_batch) for kind, chunk, micro_batch in table if kind == "weight"}
        alive = peak = 0
        for kind, chunk, micro_batch in table:
            if kind == "forward":
                alive += 1
            elif kind != "backward" or (chunk, micro_batch) not in weights:  # its last backward computation
                alive -= 1
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks


def stage_costs(forward=1.0, backward=1.0, weight=1.0):
    """Each kind's cost for a stage at these F, B and W times: a backward that is not split costs B + W."""
    split = {"forward": forward, "backward": backward, "weight": weight}
    return {kind: split.get(kind, backward + weight) for kind in UNIT}


def messages(tables, stage_of, num_stages):
    """Each rank's tensors sent to another rank in a step: a forward's output to the next stage and a backward's
    gradient to the previous one, where that stage is another rank's."""
    rank_of = {stage_of(rank, chunk): rank for rank, table in enumerate(tables) for _, chunk, _ in table}
    sent = []
    for rank, table in enumerate(tables):
        counts = {}  # (chunk, +1 forwards or -1 backwards): how many computations send that way
        for kind, chunk, _ in table:
            if kind == "forward" or kind in BACKWARDS:
                way = chunk, 1 if kind == "forward" else -1
                counts[way] = counts.get(way, 0) + 1
        targets = {way: stage_of(rank, way[0]) + way[1] for way in counts}
        sent.append(sum(count for way, count in counts.items()
                        if 0 <= targets[way] < num_stages and rank_of[targets[way]] != rank))
    return sent


class Simulation(NamedTuple):
    """A table replayed at given costs: what tools/plan.py prints of it."""
    step: float  # from the first start to the last end
    bubble: float  # the busiest rank's idle share of the step, as a script's bubble_theory
    peak_inflight: list  # each rank's most activations alive at once, in micro-batches of a stage
    messages: list  # each rank's tensors sent to another rank
    spans: dict  # {(stage, kind, micro_batch): (start, when its result is out)}, as replay gives them


def simulate(tables, placement, num_chunks, cost=UNIT, message=0.0):
    """A table's step, bubble, memory and messages in one call, at a stage's costs (stage_costs) and a message
    time. A rank holding num_chunks chunks holds 1/num_chunks of a stage in each: a chunk's computation costs
    that share of a stage's, and its activations count as that share of a micro-batch's (its peak is counted
    over its table: a rank's count changes only at its own computations). ValueError if the table cannot run."""
    num_ranks = len(tables)
    stages = {(rank, chunk): stage(placement, num_ranks, rank, chunk) for rank in range(num_ranks)
              for chunk in range(num_chunks)}

    def stage_of(rank, chunk):
        return stages[rank, chunk]

    chunk_cost = {kind: value / num_chunks for kind, value in cost.items()}
    spans = replay(tables, stage_of, num_ranks * num_chunks, chunk_cost, message)
    if len(spans) < sum(len(table) for table in tables):
        raise ValueError("the table cannot run: a rank waits for an input that the orders never make (deadlock).")
    step = max(end for _, end in spans.values()) - min(start for start, _ in spans.values())
    busiest = max(sum(chunk_cost[kind] for kind, _, _ in table) for table in tables)
    return Simulation(step, 1 - busiest / step, [peak / num_chunks for peak in peak_inflight(tables)],
                      messages(tables, stage_of, num_ranks * num_chunks), spans)


def least_step(placement, num_ranks, num_chunks, num_microbatches, cost, message, limit):
    """A lower bound on the step of any order of a stage's computations (F, B and W apart, at cost[kind]; a chunk
    costs 1/num_chunks of a stage) that keeps at most `limit` (chunk, micro_batch) pairs alive on a rank, a tensor
    between ranks taking `message`. Every rank computes m (F + B + W), and idles at least as long as
    - the data takes to reach its first stage: the forwards below it, and a message wherever the rank changes;
    - micro-batch 0 takes up every stage and back down to the rank's highest one, where its first backward can
      begin (a backward below needs that one), less the forwards it can run meanwhile: `limit` at most, since
      without a backward it frees none."""
    num_stages = num_ranks * num_chunks
    rank_of = {stage(placement, num_ranks, rank, chunk): rank for rank in range(num_ranks)
               for chunk in range(num_chunks)}
    forward, backward = cost["forward"] / num_chunks, cost["backward"] / num_chunks

    def trip(stages, each):
        """From the first of these stages beginning to the last beginning: each stage's cost, a message between
        ranks."""
        return sum(each + message * (rank_of[one] != rank_of[after]) for one, after in zip(stages, stages[1:]))

    up = trip(range(num_stages), forward) + forward  # micro-batch 0's forwards, the last stage's backward may begin
    forwards_meanwhile = min(limit, num_microbatches * num_chunks) * forward  # before a rank's first backward
    idle = []
    for rank in range(num_ranks):
        stages = [where for where, its_rank in rank_of.items() if its_rank == rank]
        first_forward = trip(range(min(stages) + 1), forward)
        first_backward = up + trip(range(num_stages - 1, max(stages) - 1, -1), backward)
        idle.append(max(first_forward, first_backward - forwards_meanwhile))
    return max(idle) + num_microbatches * (cost["forward"] + cost["backward"] + cost["weight"])


def parse_costs(text):
    """A stage's costs (stage_costs) and a message's time from "F,B,W" or "F,B,W,MSG" (MSG 0 unless given);
    ValueError with one sentence for anything else."""
    try:
        values = [float(value) for value in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (3, 4) or not all(0 < value < float("inf") for value in values[:3]) or \
            not all(0 <= value < float("inf") for value in values[3:]):
        raise ValueError(f"--costs takes F,B,W or F,B,W,MSG, positive numbers (MSG may be 0), not {text!r}.")
    return stage_costs(*values[:3]), (values[3] if len(values) == 4 else 0.0)


def naive_bubble(n):
    """01: one stage works at a time."""
    return (n - 1) / n


def gpipe_bubble(n, m):
    """02, 03, 07 and 08: n - 1 slots to fill the pipeline and n - 1 to drain it, around m forwards and m backwards."""
    return (n - 1) / (m + n - 1)


def zb_h1_bubble(n, m):
    """05, equal F, B and W: rank 0 waits 2n - 1 units for its first B; W's fill the rest (README, *Zero bubble*)."""
    return 1 - 3 * m / max(3 * m + n - 1, 2 * m + 2 * n - 1)


def zbv_bubble(n, m):
    """06, equal F, B and W: every rank computes 6m units of a span of 6m + n - 1, or, with too few
    micro-batches to fill the V, of 4m + 4n - 2."""
    return 1 - 6 * m / max(6 * m + n - 1, 4 * m + 4 * n - 2)


def one_f_one_b_inflight(n, m, rank):
    """03, 07 and 08 (05 from F to W): stage r runs n - r forwards before its first backward frees one."""
    return min(n - rank, m)


def interleaved_inflight(n, m, v, rank):
    """04: (micro-batch, chunk) pairs alive at rank's first backward, its peak: the forwards of its warm-up and
    the one before that backward, less the holes among them (position p runs micro-batch (p // nv) n + p % n)."""
    padded = -(-m // n) * n
    forwards = min((v - 1) * n + 2 * (n - rank - 1) + 1, padded * v)
    return sum((p // (n * v)) * n + p % n < m for p in range(forwards))


def zb_h1_inflight(n, m):
    """05, from F to W: 1F1B's n - r from F to B, and r W's deferred."""
    return min(n, m)


def zbv_inflight(n, m, rank):
    """06: at rank's first chunk-1 backward, the chunk-0 forwards of its warm-up (2n - r - 1) and the chunk-1
    forwards before that backward (r + 1), fewer if m is smaller."""
    return min(2 * n - rank - 1, m) + min(rank + 1, m)


def held_theory(script, n, m, blocks, rows, hidden, recompute=False):
    """Each rank's peak held bytes (docs/design.md, *Memory* and *Recomputation*), in units of one micro-batch's
    rows x hidden activation, for 02, 03 and 05 with m > n and `blocks` = L >= 2 blocks a stage (06's and 09's:
    held_count, over their tables). A micro-batch in flight holds from F to B its input and its
    blocks' ReLU outputs, L + 1 units, or with --recompute its input alone (rank 0's input is a slice of the
    batch, counted only while autograd or W keeps it), and during its B the recomputed L; from B to W (05) each
    Linear's input and output gradient, 2L. Those in transit are the tensors the loop's variables keep (a
    gradient received, an activation and a gradient sent, until the next iteration) and, in GPipe, the
    activations sent, let go of once the first gradient is back. The last stage adds its loss's saved tensors,
    `extra` (rows x 10 log-probabilities, the rows' labels, a total weight), and W the head's gradient, `head`."""
    if script not in ("02_gpipe.py", "03_1f1b.py", "05_zero_bubble.py"):
        raise ValueError(f"held_theory counts 02, 03 and 05, not {script}: count its table with held_count.")
    extra, head = (11 * rows + 1) / (rows * hidden), 10 / hidden
    L, peaks = blocks, []
    for rank in range(n):
        first, last, in_flight = rank == 0, rank == n - 1, min(n - rank, m)
        if script == "02_gpipe.py" and recompute:  # at the first gradient's receive: m inputs, m activations sent
            peak = m + L + 1 + extra if last else m + 1 if first else 2 * m + 1
        elif script == "02_gpipe.py":
            peak = m * (L + 1 + extra) if last else m * (L + 1) + 1
        elif script == "03_1f1b.py":  # in a B; in transit: the gradient received, the activation and gradient sent
            transit = 2 if first else 1 if last else 3
            if recompute:  # the inputs in flight (on rank 0 the one recomputed), the recomputed L
                peak = (1 if first else in_flight) + L + transit + extra * last
            else:  # the activation sent is a saved output; the last rank's previous input lives on in its loss's graph
                peak = in_flight * (L + 1) + transit + (extra + 1) * last
        elif last:  # 05: n W's pending, the gradient sent and the next input received, with or without --recompute
            peak = n * (2 * L + 1 + head) + 2
        else:  # 05, in a B: the r W's pending and its own (its 2L, and its output a moment more), the inputs waiting
            # for their B; in transit a gradient received (and one sent) and, with --recompute, the activation sent
            waiting = (n - rank - 1) * ((0 if first else 1) if recompute else L + 1)
            peak = waiting + 2 * L * (rank + 1) + 1 + (1 if first else 2) + recompute
        peaks.append(peak)
    return peaks


def held_count(tables, placement, blocks, rows, hidden, recompute=False):
    """06's and 09's peaks, counted over their tables at one unit a computation (a full backward two, its B then
    its W), in rows x hidden units; blocks[s]: stage s's blocks (docs/design.md, *ZB-V*, held bytes). A chunk holds
    its input and its blocks' outputs from F to B (with --recompute its input alone, and the recomputed
    outputs during B), and its Linears' inputs and output gradients from B to W; B keeps those gradients a
    moment before autograd lets go of the rest. A tensor between two ranks is held by its receiver from the
    moment it is made, and by its sender (a gradient; with --recompute an activation too, which no longer is a
    saved output) until it is used or, sooner, until the sender uses a tensor from that peer made no earlier
    than it (guarantees.release_on_arrival); the loop's `result` keeps the last F's or B's until the next ends.
    The last stage holds its rows x 10 log-probabilities from F to B and their gradient from B to W, and its
    loss the rows' labels and a total weight from F until its B begins (micro-batches of rows x hidden numbers)."""
    head, labels = 10 / hidden, (rows + 1) / (rows * hidden)
    n = len(tables)
    num_stages = n * (1 + max(chunk for table in tables for _, chunk, _ in table))
    stage_of = lambda rank, chunk: stage(placement, n, rank, chunk)  # noqa: E731
    rank_of = {stage_of(rank, chunk): rank for rank, table in enumerate(tables) for _, chunk, _ in table}.get
    spans = replay(tables, stage_of, num_stages)

    def span(where, direction, i):
        """(start, when its result is out) of stage `where`'s forward (direction "forward") or its backward."""
        kinds = ("forward",) if direction == "forward" else ("backward", "full_backward", "overlapped_backward")
        return next(spans[where, kind, i] for kind in kinds if (where, kind, i) in spans)

    events = [[] for _ in range(n)]  # per rank: (time, order within the moment, what, stage, micro-batch)
    for rank, table in enumerate(tables):
        for kind, chunk, i in table:
            where, direction = stage_of(rank, chunk), "forward" if kind == "forward" else "backward"
            events[rank].append((spans[where, kind, i][0], 1, kind, where, i))
            user = where + 1 if kind == "forward" else -1 if kind == "weight" else where - 1
            if not 0 <= user < num_stages:
                continue
            if rank_of(user) != rank:
                events[rank_of(user)].append((span(where, direction, i)[1], 0, "arrive " + direction, user, i))
            events[rank].append((span(user, direction, i)[0], 2, "used " + direction, where, i))  # the sender lets go
    peaks = []
    for rank in range(n):
        holders, sizes = {}, {}  # tensor -> who holds it (its bytes count while anyone does), its size

        def hold(tensor, who, size=1.0):
            holders.setdefault(tensor, set()).add(who)
            sizes[tensor] = size

        def drop(tensor, who):
            holders.get(tensor, set()).discard(who)

        held = lambda: sum(sizes[tensor] for tensor, who in holders.items() if who)  # noqa: E731
        peak, sent, result = 0.0, [], None  # sent: (tensor, its peer, the moment it was made)
        for _, _, what, where, i in sorted(events[rank], key=lambda event: event[:2]):
            source = where - 1 if what == "forward" else where + 1 if what in BACKWARDS else -1
            if 0 <= source < num_stages and rank_of(source) != rank:  # its input waited for: older sends there let go
                made = span(source, "forward" if what == "forward" else "backward", i)[1]
                for tensor, peer, when in sent:
                    if peer == rank_of(source) and when <= made:
                        drop(tensor, "transit")
            # a stage's input: the data, its own rank's previous chunk's output, or a received tensor
            given = ("data", i) if where == 0 else ("out", where - 1, i) if rank_of(where - 1) == rank \
                else ("in", where, i)
            made_in = "again" if recompute else "out"  # --recompute: B makes the outputs again, new tensors
            outputs = [(made_in, where, i, block) for block in range(1, blocks[where])] + [(made_in, where, i)]
            if what == "arrive forward":
                hold(("in", where, i), "transit")
            elif what == "arrive backward":
                hold(("grad", where + 1, i), "transit")
            elif what == "forward" and recompute:
                if where > 0:
                    hold(given, ("F", where, i))
                if where < num_stages - 1:  # sent, or handed to this rank's other chunk
                    hold(("out", where, i), "transit")
                    sent.append((("out", where, i), rank_of(where + 1), span(where, "forward", i)[1]))
                drop(given, "transit")
            elif what == "forward":
                for tensor in [given] + outputs:
                    hold(tensor, ("F", where, i))
                drop(given, "transit")
                if where == num_stages - 1:
                    hold(("log-probabilities", i), ("F", where, i), head)
                    hold(("labels", i), ("F", where, i), labels)
            elif what in BACKWARDS:
                drop(("labels", i), ("F", where, i))  # the loss lets go of them first, as its backward begins
                if recompute:  # the forward again: B holds what F held without the flag
                    for tensor in [given] + outputs:
                        hold(tensor, ("F", where, i))
                    if where == num_stages - 1:
                        hold(("log-probabilities", i), ("F", where, i), head)
                inputs = [given] + outputs[:-1] + ([outputs[-1]] if where == num_stages - 1 else [])
                for tensor in inputs + [("grad", where, i, block) for block in range(blocks[where])]:
                    hold(tensor, ("W", where, i))
                if where == num_stages - 1:
                    hold(("grad of log-probabilities", i), ("W", where, i), head)
                peak = max(peak, held())
                for tensor in [given] + outputs + [("log-probabilities", i), ("grad", where + 1, i)]:
                    drop(tensor, ("F", where, i))
                    drop(tensor, "transit")
                if where > 0:
                    hold(("grad", where, i), "transit")  # to the previous stage
                    sent.append((("grad", where, i), rank_of(where - 1), span(where, "backward", i)[1]))
            if what == "used backward":
                drop(("grad", where, i), "transit")
            elif what == "used forward":
                drop(("out", where, i), "transit")
            if what in ("forward", *BACKWARDS):  # the new result replaces the loop's `result`
                drop(result, "result")
                result = ("out", where, i) if what == "forward" else ("grad", where, i)
                if (where < num_stages - 1) if what == "forward" else (where > 0):  # not the loss, nor nothing
                    hold(result, "result")
            if what in ("weight", "full_backward", "overlapped_backward"):  # a full backward's W: right after its B
                peak = max(peak, held())
                for tensor in holders:
                    drop(tensor, ("W", where, i))
            peak = max(peak, held())
        peaks.append(peak)
    return peaks
