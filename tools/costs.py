"""A table at a stage's costs, on paper (tools/plan.py and the search): its step, bubble, peaks and messages, and
the least step any order can take. Plain Python over theory.replay.

stage_costs   each kind's cost at a stage's F, I and W times (parse_costs: from "F,I,W[,MSG]")
simulate      a table replayed at those costs: a Simulation (step, bubble, peaks, messages, spans)
messages      each rank's tensors sent to another rank in a step
least_step    a step no order within a memory can beat, where the search stops
no_cycles     a decorator: Python's cycle collector off while a planner replays
"""

import functools
import gc
import math
from typing import NamedTuple

import theory


def stage_costs(forward=1.0, input_grad=1.0, weight=1.0):
    """Each kind's cost for a stage at these F, I and W times: a full backward (B) costs I + W."""
    split = {"forward": forward, "backward": input_grad, "weight": weight}
    return {kind: split.get(kind, input_grad + weight) for kind in theory.UNIT_COSTS}


def no_cycles(function):
    """function run with Python's cycle collector off. A replay makes millions of small tuples and no cycle; they
    outlive it in its spans, and each full collection scans them all again: at 64 stages and 256 micro-batches
    that was 40% of tools/plan.py's time. Memory is still freed as each object's last reference goes."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        was_on = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if was_on:
                gc.enable()
    return run


def messages(tables, stage_of, num_stages):
    """Each rank's tensors sent to another rank in a step: a forward's output to the next stage and an I's or a B's
    gradient to the previous one, where that stage is another rank's."""
    rank_of = {stage_of(rank, chunk): rank for rank, table in enumerate(tables) for _, chunk, _ in table}
    sent = []
    for rank, table in enumerate(tables):
        counts = {}  # (chunk, +1 forwards or -1 backwards): how many computations send that way
        for kind, chunk, _ in table:
            if kind == "forward" or kind in theory.BACKWARDS:
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
    bubble_window: float  # the zero-bubble paper's: 1 - the busiest rank's work over the longest rank's window
    window_idle: float  # the most any rank idles within its own window, first start to last end (DeepSeek's bubble)
    peak_inflight: list  # each rank's most activations alive at once, in micro-batches of a stage
    messages: list  # each rank's tensors sent to another rank
    spans: dict  # {(kind, stage, micro_batch): (start, when its result is out)}, as replay gives them


def simulate(tables, placement, num_chunks, cost=theory.UNIT_COSTS, message=0.0, weight_memory=1, overlap=1.0):
    """A table's step, bubble, memory and messages in one call, at a stage's costs (stage_costs) and a message
    time. A rank holding num_chunks chunks holds 1/num_chunks of a stage in each: a chunk's computation costs
    that share of a stage's (unless cost is a list, each chunk's own: theory.counted_costs), and its activations
    count as that share of a micro-batch's (its peak is counted over its table: a rank's count changes only at
    its own computations; an I leaves weight_memory of a pair held until its W); an F&B step lasts `overlap` of its
    two parts (theory.replay). ValueError if the table cannot run."""
    num_ranks = len(tables)
    stages = {(rank, chunk): theory.stage(placement, num_ranks, rank, chunk) for rank in range(num_ranks)
              for chunk in range(num_chunks)}

    def stage_of(rank, chunk):
        return stages[rank, chunk]

    chunk_cost = cost if isinstance(cost, list) else {kind: value / num_chunks for kind, value in cost.items()}
    spans = theory.replay(tables, stage_of, num_ranks * num_chunks, chunk_cost, message, overlap)
    if len(spans) < sum(len(table) for table in tables):
        raise ValueError("the table cannot run: a rank waits for an input that the orders never make (deadlock).")
    step = max(end for _, end in spans.values()) - min(start for start, _ in spans.values())
    busy = theory.computing(tables, stage_of, num_ranks * num_chunks, chunk_cost, overlap)
    windows = []  # each rank's, from its first computation's start to its last's end
    for rank, table in enumerate(tables):
        mine = [spans[kind, stage_of(rank, chunk), micro_batch] for kind, chunk, micro_batch in table]
        windows.append(max(end for _, end in mine) - min(start for start, _ in mine))
    return Simulation(step, 1 - max(busy) / step, 1 - max(busy) / max(windows),
                      max(window - work for window, work in zip(windows, busy)),
                      [peak / num_chunks for peak in theory.peak_inflight(tables, weight_memory)],
                      messages(tables, stage_of, num_ranks * num_chunks), spans)


def least_step(placement, num_ranks, num_chunks, num_microbatches, cost, message, limit):
    """A lower bound on the step of any order of a stage's computations (F, I and W apart, at cost[kind]; a chunk
    costs 1/num_chunks of a stage) that keeps at most `limit` (chunk, micro_batch) pairs alive on a rank, a tensor
    between ranks taking `message`. Every rank computes m (F + I + W), and idles at least as long as
    - the data takes to reach its first stage: the forwards below it, and a message wherever the rank changes;
    - micro-batch 0 takes up every stage and back down to the rank's highest one, where its first I can
      begin (an I below needs that one), less the forwards it can run meanwhile: `limit` at most, since
      without an I it frees none."""
    num_stages = num_ranks * num_chunks
    rank_of = {theory.stage(placement, num_ranks, rank, chunk): rank for rank in range(num_ranks)
               for chunk in range(num_chunks)}
    forward, input_grad = cost["forward"] / num_chunks, cost["backward"] / num_chunks

    def trip(stages, each):
        """From the first of these stages beginning to the last beginning: each stage's cost, a message between
        ranks."""
        return sum(each + message * (rank_of[one] != rank_of[after]) for one, after in zip(stages, stages[1:]))

    up = trip(range(num_stages), forward) + forward  # micro-batch 0's forwards, the last stage's I may begin
    forwards_meanwhile = min(math.floor(limit + 1e-9), num_microbatches * num_chunks) * forward  # before its first I
    idle = []
    for rank in range(num_ranks):
        stages = [where for where, its_rank in rank_of.items() if its_rank == rank]
        first_forward = trip(range(min(stages) + 1), forward)
        first_input_grad = up + trip(range(num_stages - 1, max(stages) - 1, -1), input_grad)
        idle.append(max(first_forward, first_input_grad - forwards_meanwhile))
    return max(idle) + num_microbatches * (cost["forward"] + cost["backward"] + cost["weight"])


def parse_costs(text):
    """A stage's costs (stage_costs) and a message's time from "F,I,W" or "F,I,W,MSG" (MSG 0 unless given);
    ValueError with one sentence for anything else."""
    try:
        values = [float(value) for value in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (3, 4) or not all(0 < value < float("inf") for value in values[:3]) or \
            not all(0 <= value < float("inf") for value in values[3:]):
        raise ValueError(f"--costs takes F,I,W or F,I,W,MSG, positive numbers (MSG may be 0), not {text!r}.")
    return stage_costs(*values[:3]), (values[3] if len(values) == 4 else 0.0)
