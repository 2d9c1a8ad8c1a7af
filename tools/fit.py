"""What a real step pays beside its computations, fitted from one run's --trace, and a table's step at those prices
(tools/plan.py --costs-from). A trace gives each computation's span, and its waits how long a message took to
hand over where a rank waited for it; its "step in parts" row (harness/summary.py) gives the runtime's own time
between computations and each rank's time between steps. Times in microseconds, the trace's unit.

fit         a message's hand-over, the runtime per computation and per message, each rank's time between steps, and
            what a forward pays more where its weights have left the cache
run_step    a table's step as a run measures it (step_ms_mean), in microseconds, at a stage's costs and those prices
as_run      a stage's costs with its full backward as the schedule's own script runs it
"""

import collections
import statistics
from typing import NamedTuple

import torch

import theory
from harness.meters import COMPUTE

# The schedules whose own script runs a full backward (B) as one autograd backward (02, 03, 04): autograd makes each
# weight gradient in new memory and then adds it into .grad, where 05's W adds its product in place (addmm_), so such
# a B costs more than I + W: on this machine's CPUs about two F, as its multiply-adds count (docs/design.md). 09 runs
# every B as its I, then its W at once: I + W.
AUTOGRAD_BACKWARD = ("gpipe", "1f1b", "interleaved-1f1b")


class Prices(NamedTuple):
    """What a run pays beside its computations, in microseconds."""
    latency: float  # a message's hand-over, from the end of the computation that makes it to its receive's end
    per_computation: float  # the runtime's own time around each computation (bookkeeping, Python)
    per_message: float  # and for each message a computation receives or sends to another rank (posting it)
    outside: tuple  # between steps (the optimizer, zero_grad): a block's share and the head's, per stage
    cold_forward: float = 0.0  # a block's more for a forward whose weights the cache no longer holds (_cold_forwards)
    cold_share: float = 0.0  # the share of the fitted run's forwards that were such: its mean forward holds them


def fit(trace):
    """Prices from a harness trace (the dict): the runtime's own time before each computation fitted by least squares
    as per_computation + per_message x the messages posted there (its own receive, the previous computation's send);
    each rank's time between steps fitted as a block's share times the blocks it holds plus the head's on the rank
    that holds the last stage (otherData's blocks: each stage's); a message's hand-over from the waits for one
    (_handover), else the latency the run measured at start-up (otherData); and what a forward pays more where its
    weights have left the cache (_cold_forwards).
    ValueError if the trace has no step in parts (a trace of another program's, or of an older version)."""
    events, other = trace.get("traceEvents", []), trace.get("otherData", {})
    computations = [event for event in events if event.get("ph") == "X" and event.get("cat") in COMPUTE]
    parts = _stretches(events)
    blocks = other.get("blocks")
    if not parts or "measured_steps" not in other or not blocks:
        raise ValueError("it has no row of each rank's step in parts: pass the --trace of a run on this version.")
    measured = set(other["measured_steps"])  # only these steps' stretches are in parts
    computations = [event for event in computations if event["args"]["step"] in measured]
    rank_of = {event["args"]["stage"]: event["pid"] for event in computations}
    samples = []  # (messages posted, runtime's own microseconds) before a computation
    for rank in parts:
        mine = sorted((event for event in computations if event["pid"] == rank), key=lambda event: event["ts"])
        runtime = [(start, end) for part, start, end in parts[rank] if part == "runtime"]
        for previous, event in zip(mine, mine[1:]):
            spent = sum(end - start for start, end in runtime if previous["ts"] <= start and end <= event["ts"])
            posted = _messages(event["cat"], event["args"]["stage"], rank_of)[0] + \
                _messages(previous["cat"], previous["args"]["stage"], rank_of)[1]
            samples.append((posted, spent))
    per_computation, per_message = _line(samples)
    outside = {rank: sum(end - start for part, start, end in parts[rank] if part == "outside") / len(measured)
               for rank in parts}
    holds = {rank: [stage for stage, its_rank in rank_of.items() if its_rank == rank] for rank in parts}
    shares = [(sum(blocks[stage] for stage in holds[rank]), len(blocks) - 1 in holds[rank], outside[rank])
              for rank in parts]
    waits = [event for event in events if event.get("ph") == "X" and event.get("cat") == "wait"
             and event["args"]["step"] in measured]
    handover = _handover(computations, waits, rank_of)
    latency = other.get("message_latency_ms", 0.0) * 1e3 if handover is None else handover
    return Prices(latency, per_computation, per_message, _block_and_head(shares), *_cold_forwards(computations, blocks))


def run_step(tables, placement, num_chunks, stage_costs, prices, blocks):
    """A table's step as a run measures it, steps back to back: the table replayed (theory.replay) with each
    computation costing its stage's cost (stage_costs: each stage's {kind: cost}) plus the runtime's per
    computation and per message it receives or sends to another rank, each message taking the latency; then,
    since a rank's time between steps must fit between its last computation of one step and its first of the next,
    the longest of the replay less a rank's idle time at its two ends plus its time between steps (its stages'
    blocks' shares of it, and the head's if it holds the last stage; blocks: each stage's, fractions allowed)."""
    num_ranks = len(tables)
    num_stages = num_ranks * num_chunks
    stages = {(rank, chunk): theory.stage(placement, num_ranks, rank, chunk) for rank in range(num_ranks)
              for chunk in range(num_chunks)}
    rank_of = {stage: rank for (rank, _), stage in stages.items()}
    priced = [{kind: value + prices.per_computation + prices.per_message * sum(_messages(kind, stage, rank_of))
               for kind, value in cost.items()} for stage, cost in enumerate(stage_costs)]
    for stage, share in _cold_shares(tables, stages).items():  # a forward's mean at this table's share of cold ones
        priced[stage]["forward"] += prices.cold_forward * blocks[stage] * (share - prices.cold_share)
    spans = theory.replay(tables, lambda rank, chunk: stages[rank, chunk], num_stages, priced, prices.latency)
    length = max(end for _, end in spans.values())
    block, head = prices.outside
    steps = []
    for rank, table in enumerate(tables):
        mine = [spans[kind, stages[rank, chunk], micro_batch] for kind, chunk, micro_batch in table]
        ends = min(start for start, _ in mine) + length - max(end for _, end in mine)
        held = [stages[rank, chunk] for chunk in range(num_chunks)]
        outside = sum(block * blocks[stage] for stage in held) + head * (num_stages - 1 in held)
        steps.append(length - ends + outside)
    return max(steps)


def _cold_forwards(computations, blocks):
    """A forward finds its weights in the cache right after a forward or an I of its own chunk, which read them; after
    anything else (a W, which writes the weight gradients, a full backward, the other chunk's computation, or the
    optimizer, which sweeps every tensor between steps) it reads them from memory again and takes longer: the extra
    a block, the mean over such cold forwards of their span less their stage's warm forwards' mean, per block of the
    stage (none less than nothing); and the share of the run's forwards that were cold. (0, 0) without both kinds."""
    cold, warm = [], {}  # cold: (stage, span); warm: stage -> spans
    for rank in {event["pid"] for event in computations}:
        mine = sorted((event for event in computations if event["pid"] == rank), key=lambda event: event["ts"])
        for previous, event in zip([None, *mine], mine):
            if event["cat"] != "forward":
                continue
            if previous is None or previous["args"]["step"] != event["args"]["step"]:
                cold.append((event["args"]["stage"], event["dur"]))  # the step's first: after the optimizer
                continue
            if _finds_weights(previous["cat"], previous["args"]["chunk"], event["args"]["chunk"]):
                warm.setdefault(event["args"]["stage"], []).append(event["dur"])
            else:
                cold.append((event["args"]["stage"], event["dur"]))
    extras = [(span - statistics.mean(warm[stage])) / blocks[stage] for stage, span in cold
              if stage in warm and blocks[stage]]
    if not extras:
        return 0.0, 0.0
    return max(0.0, statistics.mean(extras)), len(cold) / (len(cold) + sum(map(len, warm.values())))


def _finds_weights(previous_kind, previous_chunk, chunk):
    """Whether a forward of this chunk finds its weights in the cache after the rank's computation before it (a
    trace's category or a table's kind: a table's full backward is neither a forward nor an I)."""
    return previous_kind in ("forward", "backward") and previous_chunk == chunk


def _cold_shares(tables, stages):
    """Each stage's share of cold forwards (_cold_forwards) in its rank's table (stages: (rank, chunk) -> stage)."""
    counts = {}  # stage -> [cold forwards, forwards]
    for rank, table in enumerate(tables):
        for previous, (kind, chunk, _) in zip([None, *table], table):
            if kind == "forward":
                count = counts.setdefault(stages[rank, chunk], [0, 0])
                count[0] += previous is None or not _finds_weights(previous[0], previous[1], chunk)
                count[1] += 1
    return {stage: cold / forwards for stage, (cold, forwards) in counts.items()}


def as_run(cost, schedule):
    """A stage's {kind: cost} with a full backward (plain or overlapped) priced as the schedule's own script runs it:
    I + W (09), or, where one autograd backward runs it (AUTOGRAD_BACKWARD), its I and then the weight gradients'
    products into new memory, each as many multiply-adds as a forward's, priced at the larger of the stage's F and W."""
    if schedule not in AUTOGRAD_BACKWARD:
        return cost
    full = cost["backward"] + max(cost["forward"], cost["weight"])
    return {**cost, "full_backward": full, "overlapped_backward": full}


def _stretches(events):
    """Each rank's step in parts from the trace's begin and end events: {rank: [(part, start, end)]}."""
    parts, opened = {}, {}
    for event in events:
        if event.get("tid") != 1 or event.get("ph") not in ("B", "E"):
            continue
        if event["ph"] == "B":
            opened[event["pid"]] = event
        else:
            begun = opened.pop(event["pid"])
            parts.setdefault(event["pid"], []).append((begun["name"], begun["ts"], event["ts"]))
    return parts


def _handover(computations, waits, rank_of):
    """A message's hand-over as the run paid it: from the end of the computation on another rank that made it to the
    end of the wait for it just before the computation that uses it (the sender's posting, the wire, the receiver
    waking), over the waits that began before it was made, so that nothing else held the receiver: the median, in
    microseconds, or None where no rank waited so."""
    made = {(event["cat"], event["args"]["stage"], event["args"]["step"], event["args"]["micro_batch"]):
            event["ts"] + event["dur"] for event in computations if event["cat"] != "weight"}
    samples = []
    for rank in set(rank_of.values()):
        mine = sorted((event for event in computations + waits if event["pid"] == rank), key=lambda event: event["ts"])
        for wait, event in zip(mine, mine[1:]):
            if wait["cat"] != "wait" or event["cat"] not in ("forward", "backward", "full_backward"):
                continue
            stage, step, micro_batch = event["args"]["stage"], event["args"]["step"], event["args"]["micro_batch"]
            source = stage - 1 if event["cat"] == "forward" else stage + 1  # the stage that made its input
            sent = made.get((event["cat"], source, step, micro_batch))
            if sent is not None and rank_of[source] != rank and wait["ts"] < sent:
                samples.append(wait["ts"] + wait["dur"] - sent)
    return statistics.median(samples) if samples else None


def _messages(kind, stage, rank_of):
    """How many messages a computation of this kind on this stage receives and sends to another rank (rank_of:
    each stage's): a forward's input from the previous stage and its output to the next, a backward's (I, B or an
    F&B's B) the other way, a W none."""
    if kind == "weight":
        return 0, 0
    before, after = (stage - 1, stage + 1) if kind == "forward" else (stage + 1, stage - 1)
    rank = rank_of[stage]
    return int(rank_of.get(before, rank) != rank), int(rank_of.get(after, rank) != rank)


def _line(samples):
    """The least-squares a + b x through (x, y) samples, b at least 0 (else a is the mean)."""
    count = len(samples)
    mean_x = sum(x for x, _ in samples) / count
    mean_y = sum(y for _, y in samples) / count
    spread = sum((x - mean_x) ** 2 for x, _ in samples)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / spread if spread else 0.0
    if slope < 0:
        return mean_y, 0.0
    return mean_y - slope * mean_x, slope


def _block_and_head(shares):
    """A block's share and the head's of each rank's time between steps, (blocks, holds the head, time) a rank, by
    least squares; where no two ranks tell them apart, the head's share is 0."""
    xx = sum(blocks * blocks for blocks, _, _ in shares)
    xh = sum(blocks * head for blocks, head, _ in shares)
    hh = sum(head for _, head, _ in shares)
    xy = sum(blocks * time for blocks, _, time in shares)
    hy = sum(time for _, head, time in shares if head)
    determinant = xx * hh - xh * xh
    if abs(determinant) < 1e-9 * max(xx * hh, 1):
        return (xy / xx if xx else 0.0), 0.0
    return (xy * hh - xh * hy) / determinant, (xx * hy - xh * xy) / determinant


class RowCosts(NamedTuple):
    """F, I and W against a micro-batch's rows, fitted over several traces (fit_rows), in microseconds: each kind's
    (a, b) of a block and its knee k, a + b max(r, k) at r rows (a: what a block pays whatever its rows, its calls;
    b: a row's arithmetic; below k rows the pass takes as long as at k: reading its weights again, b k, bounds it,
    not its arithmetic), and the head's (c, d), its counted share of a block's; a cold forward's more a block
    (cold_forward); a message's hand-over (a, b), a line, as its bytes grow with its rows; and the runtime's
    prices, the traces' means (prices_at gives them at a micro-batch's rows)."""
    block: dict  # kind -> (a, b)
    head: dict  # kind -> (c, d): the head's share of a block (theory.counted_costs) times (a, b)
    cold_forward: float
    latency: tuple = (0.0, 0.0)  # (a, b)
    prices: Prices = None
    knee: dict = {}  # kind -> k rows (none: the line a + b r)

    def stage_costs(self, split, rows):
        """Each stage's {kind: cost} at `rows` rows a micro-batch, split: each stage's blocks, the last one the head's:
        its forward warm (run_step adds the cold ones' more at the table's share)."""
        costs = []
        for stage, count in enumerate(split):
            has_head = stage == len(split) - 1
            cost = {}
            for kind, (a, b) in self.block.items():
                at = max(rows, self.knee.get(kind, 0.0))  # below its knee, a pass costs what it does at the knee
                cost[kind] = count * (a + b * at) + has_head * (self.head[kind][0] + self.head[kind][1] * at)
            costs.append({**cost, "full_backward": cost["backward"] + cost["weight"],
                          "overlapped_backward": cost["backward"] + cost["weight"]})
        return costs

    def prices_at(self, rows):
        """What a run pays beside its computations at `rows` rows a micro-batch (run_step): the traces' prices, a
        message's hand-over at those rows, a cold forward's more (the fitted forward is a warm one)."""
        return self.prices._replace(latency=self.latency[0] + self.latency[1] * rows, cold_forward=self.cold_forward,
                                    cold_share=0.0)


def fit_rows(traces):
    """A block's F, I and W against its rows (RowCosts), by least squares over every measured computation of several
    harness traces (dicts) at different micro-batch sizes: a span lasts its stage's blocks times (a + b max(r, k))
    and a cold forward (_finds_weights) a block's cold_forward more; r: the rows of its micro-batch (otherData's
    rows); k: each kind's knee, of KNEES tried from the smallest size to the largest, the one that fits best. The
    last stage's head and loss count as their share of a block (theory.counted_costs), not fitted: on a pipeline's
    last stage alone, a fitted head would take in whatever else makes that rank slower. The runtime's prices: each
    trace's (fit), their means; a message's hand-over, the line through each trace's against its mean rows.
    ValueError, one sentence, where the traces cannot tell a block's parts apart: fewer than two sizes, or no
    blocks."""
    samples = {kind: [] for kind in ("forward", "backward", "weight")}  # kind -> [(features, span)]
    models = {(trace.get("otherData", {}).get("hidden"), trace.get("otherData", {}).get("classes")) for trace in traces}
    if len(models) > 1 or None in next(iter(models)):
        raise ValueError("the traces must give one model's --hidden and --classes: pass traces of this version, "
                         "of runs of one model.")
    [(hidden, classes)] = models
    head = theory.counted_costs([0], hidden, classes)[0]  # the head's F, I and W, in blocks
    for trace in traces:
        other = trace.get("otherData", {})
        blocks, rows, measured = other.get("blocks"), other.get("rows"), set(other.get("measured_steps", []))
        if not blocks or not rows:
            raise ValueError("a trace gives no micro-batch's rows or stage's blocks: pass traces of this version.")
        last = len(blocks) - 1
        computations = sorted((event for event in trace.get("traceEvents", []) if event.get("ph") == "X"
                               and event.get("cat") in samples and event["args"]["step"] in measured),
                              key=lambda event: (event["pid"], event["ts"]))
        for previous, event in zip([None, *computations], computations):
            kind, stage, size = event["cat"], event["args"]["stage"], rows[event["args"]["micro_batch"]]
            count = blocks[stage] + (stage == last) * head[kind]  # the head as its share of a block
            cold = kind == "forward" and not (
                previous is not None and previous["pid"] == event["pid"]
                and previous["args"]["step"] == event["args"]["step"]
                and _finds_weights(previous["cat"], previous["args"]["chunk"], event["args"]["chunk"]))
            features = [count, size] + ([cold * blocks[stage]] if kind == "forward" else [])
            samples[kind].append((features, event["dur"], (id(trace), stage)))
    sizes = {features[1] for kind in samples for features, _, _ in samples[kind] if features[0]}
    if len(sizes) < 2:
        raise ValueError("the traces hold one micro-batch size: pass traces of runs at two micro-batch counts or more.")
    block, knee, cold_forward = {}, {}, 0.0
    for kind, rows_of in samples.items():
        if not rows_of:
            raise ValueError(f"the traces have no {kind} spans: pass traces of a script that splits the backward (05).")
        knee[kind], solution = _knee_fit(rows_of, min(sizes), max(sizes))
        block[kind] = solution[0], solution[1]
        if kind == "forward":
            cold_forward = max(0.0, solution[2])
    each = [fit(trace) for trace in traces]
    latency = _line([(statistics.mean(trace["otherData"]["rows"]), prices.latency)
                     for trace, prices in zip(traces, each)])
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    outside = tuple(mean([prices.outside[part] for prices in each]) for part in (0, 1))
    prices = Prices(mean([p.latency for p in each]), mean([p.per_computation for p in each]),
                    mean([p.per_message for p in each]), outside)
    head_costs = {kind: (head[kind] * a, head[kind] * b) for kind, (a, b) in block.items()}
    return RowCosts(block, head_costs, cold_forward, latency, prices, knee)


KNEES = 64  # the knees fit_rows tries, spaced evenly in log(rows) from the smallest size to the largest


def _knee_fit(rows_of, smallest, largest):
    """One kind's knee k and its least squares [a, b] (and a forward's cold_forward) over rows_of's ((count, rows,
    and a forward's cold blocks), span, where): a span lasts count (a + b max(rows, k)) (plus cold blocks times
    cold_forward), at the k of KNEES that fits best. The first k is the smallest size, where the fit is the line
    a + b r; another replaces it only where it fits better. Each trace's stage (where) counts alike, however many
    micro-batches it ran: the fit is of the sizes, not of the events."""
    group = collections.Counter(where for _, _, where in rows_of)
    weights = torch.tensor([[group[where] ** -0.5] for _, _, where in rows_of], dtype=torch.float64)
    spans = weights * torch.tensor([[span] for _, span, _ in rows_of], dtype=torch.float64)
    best = None  # (residual, knee, solution)
    for step in range(KNEES):
        knee = smallest * (largest / smallest) ** (step / KNEES)
        table = [[count, count * max(rows, knee), *more] for (count, rows, *more), _, _ in rows_of]
        features = weights * torch.tensor(table, dtype=torch.float64)
        solution = torch.linalg.lstsq(features, spans, driver="gelsd").solution
        residual = float(((features @ solution - spans) ** 2).sum())
        if best is None or residual < best[0]:
            best = residual, knee, solution.flatten().tolist()
    return best[1], best[2]
