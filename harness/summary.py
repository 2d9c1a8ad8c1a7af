"""The end of a run: every rank's records on rank 0, the summary of what each rank computed, idled
and held, its comparison with the theory, its step in parts beside the step's limit, the table and the JSON line."""

import bisect
import itertools
import json
import math
import os
import statistics
import sys
from collections import defaultdict, namedtuple

import torch
import torch.distributed as dist

import theory
from harness import pictures
from harness.meters import COMPUTE, TP, recorder
from harness.startup import dump_run

# One rank's records (see meters.py), its model chunks' (first, last) layers, its peak activation and
# held bytes, torch.cuda.max_memory_allocated (-1 on the CPU), its computations longer than --pace, its parameter bytes.
Records = namedtuple("Records", "spans steps losses posts layers activation_peak held_peak cuda_peak overruns params")
PARTS = ("compute", "schedule_wait", "extra_wait", "runtime", "outside")  # a step's parts: each instant in one
Stretch = namedtuple("Stretch", "part start end")  # a stretch of a rank's time in one part, on rank 0's clock


def report(args, stages, expected_inflight, bubble_theory=None, expected_parameter_bytes=None):
    """Write --dump-grads and --dump-params (startup.dump_run), gather every rank's measurements on rank 0, and
    print the timeline, the table and the JSON line (the script ends the run: common.finish). stages: this rank's
    model chunks (their .layers and parameters). expected_inflight(rank): the micro-batches (or micro-batch and
    chunk pairs) the schedule keeps alive on that rank. bubble_theory: the schedule's with every
    span equally long, which holds where the stages cost the same, else its order is replayed at the paced spans
    (theory.paced_spans); or a function of those spans giving each rank's (09: its table's replay, a full
    backward I then W).
    expected_parameter_bytes(rank) (08): its parameter bytes."""
    dump_run(args, stages)
    cuda_peak = torch.cuda.max_memory_allocated(recorder.device) if recorder.device.type == "cuda" else -1
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, Records(recorder.spans, recorder.steps, recorder.losses, recorder.posts,
                                          [tuple(stage.layers) for stage in stages], recorder.saved.peak,
                                          recorder.held.peak, cuda_peak, recorder.overruns,
                                          sum(p.nbytes for stage in stages for p in stage.parameters())))
    if dist.get_rank() == 0:
        timed = list(range(1, args.steps)) if args.steps > 1 else [0]  # the first step pays for warm-up
        measured = [step for step in timed if not args.overhead or step % 2 == 0]  # --overhead: the even ones
        summary = _summarize(args, ranks, timed, measured)
        if callable(bubble_theory):  # a replay of the table at --pace's spans, a full backward I then W
            spans = theory.paced_spans(theory.counted_costs(args.blocks, args.hidden, args.classes), theory.UNIT_COSTS)
            summary["bubble_theory_per_rank"] = bubble_theory(spans)
        elif bubble_theory is not None and len({round(cost, 9) for cost in summary["stage_costs"]}) == 1:
            summary["bubble_theory_per_rank"] = [bubble_theory] * len(ranks)  # a closed form: stages of equal cost
        if "bubble_theory_per_rank" in summary:  # the busiest rank's: the least idle share of one span
            summary["bubble_theory"] = min(summary["bubble_theory_per_rank"])
        if expected_parameter_bytes:
            summary["expected_parameter_bytes"] = [expected_parameter_bytes(rank) for rank in range(len(ranks))]
        chunks, spans = len(stages) > 1, [rank.spans for rank in ranks]  # chunks: label spans with their chunk
        if args.no_instrument:  # (so no --trace or --svg either)
            print(f"step time (median) {summary['step_ms_median']:.1f} ms")
        else:
            summary.update(_per_rank(ranks, measured, len(ranks) // args.data_parallel, expected_inflight))
            stretches = _compare(args, summary, ranks, measured)
            print(pictures.timeline(spans, len(stages)))
            print(_table(summary, [rank.layers for rank in ranks]))
        if args.trace:
            other = {"blocks": args.blocks, "measured_steps": measured,
                     "message_latency_ms": summary["message_latency_ms"], "batch_size": args.batch_size,
                     "micro_batches": args.micro_batches, "rows": _rows(args), "hidden": args.hidden,
                     "classes": args.classes}
            pictures.write_trace(args.trace, spans, chunks, _stages(ranks), other, stretches)
        if args.svg:
            pictures.write_svg(args.svg, spans, len(stages), summary)
        if args.json:
            print(json.dumps(summary), flush=True)


def _summarize(args, ranks, timed, measured):
    """The run's shape, its losses, its step times (each from the first rank's start to the last's end), a message's
    latency, each rank's CPU time a step, and each rank's layers (a pair, or a pair per model chunk) and parameter
    bytes."""
    times = [time for rank in ranks for time in rank.steps]
    step_ms = {step: 1e3 * (max(t.end for t in times if t.step == step) - min(t.start for t in times if t.step == step))
               for step in timed}
    layers = [[list(chunk) for chunk in rank.layers] for rank in ranks]
    summary = {
        "script": os.path.basename(sys.argv[0]), "world_size": len(ranks), "num_microbatches": args.micro_batches,
        **{flag: getattr(args, flag) for flag in ("data_parallel", "tensor_parallel", "virtual_stages", "batch_size",
                                                  "layers", "hidden", "dtype", "steps", "threads", "sync_sends",
                                                  "recompute")},
        "losses": max(reversed([rank.losses for rank in ranks]), key=len),  # the last rank's that has any: the head's
        "step_ms_median": statistics.median_high([step_ms[step] for step in measured]),
        "message_latency_ms": 1e3 * recorder.latency,  # measured at start-up (startup._measure_latency)
        "step_cpu_ms": [1e3 * statistics.median_high([t.cpu for t in rank.steps if t.step in measured])
                        for rank in ranks],  # the CPU time each rank's process spends in a step, all its threads
        "stage_layers": layers if len(ranks[0].layers) > 1 else [chunk for (chunk,) in layers],
        "parameter_bytes": [rank.params for rank in ranks],
        "classes": args.classes, "partition": args.partition, "blocks": args.blocks,
        **_costs(args, ranks),
        **{flag: getattr(args, flag) for flag in ("schedule", "placement", "costs", "memory") if hasattr(args, flag)},
    }
    if args.overhead:
        summary["step_ms_median_bare"] = statistics.median_high([step_ms[step] for step in timed if step % 2])
    return summary


def _rows(args):
    """Each micro-batch's rows in pipeline 0 (07's and 08's copies each take a share of the batch, the first ones
    the larger where it does not divide), as the scripts cut it (tensor_split)."""
    share = torch.arange(args.batch_size).tensor_split(args.data_parallel)[0]
    return [len(part) for part in share.tensor_split(args.micro_batches)]


def _stages(ranks):
    """Each rank's chunks' stages, from their first layers (07: a stage's copies, 08: its shards share one)."""
    firsts = sorted({first for rank in ranks for first, _ in rank.layers})
    return [[firsts.index(first) for first, _ in rank.layers] for rank in ranks]


def _costs(args, ranks):
    """Each stage's counted F + I + W for a micro-batch (theory.counted_costs, in block forwards), each rank's for
    a step, and the stage that bounds the step: the costliest (the first such)."""
    stage_costs = [sum(cost[kind] for kind in ("forward", "backward", "weight"))
                   for cost in theory.counted_costs(args.blocks, args.hidden, args.classes)]
    return {"stage_costs": stage_costs, "bounding_stage": stage_costs.index(max(stage_costs)),
            "counted_cost": [args.micro_batches * sum(stage_costs[stage] for stage in stages)
                             for stages in _stages(ranks)]}


def _per_rank(ranks, measured, num_stages, expected_inflight):
    """Each rank's bubble, compute and idle time, micro-batches in flight and bytes held, over the measured steps."""
    world = len(ranks)
    compute, windows, reduced, hidden = ([0.0] * world for _ in range(4))
    inflight = [0] * world
    for step in measured:
        spans = [[span for span in rank.spans if span.step == step] for rank in ranks]
        work = [[span for span in rank if span.kind in COMPUTE] for rank in spans]
        for rank, computed in enumerate(work):
            # The bubble is measured against the rank's pipeline's own span: from the first forward
            # anywhere in it to the last computation anywhere in it. Blocked in a receive counts as idle.
            first = rank - rank % num_stages  # the pipeline is ranks first to first + num_stages - 1 (08: a copy's)
            pipeline = [span for theirs in work[first:first + num_stages] for span in theirs]
            begin, end = min(span.start for span in pipeline), max(span.end for span in pipeline)
            windows[rank] += end - begin
            compute[rank] += sum(span.end - span.start for span in computed)
            inflight[rank] = max(inflight[rank], _peak_inflight(computed))
            for span in spans[rank]:  # 07's all-reduce is hidden for as long as it overlaps the pipeline's span
                if span.kind == "allreduce":
                    reduced[rank] += span.end - span.start
                    hidden[rank] += max(0.0, min(span.end, end) - span.start)
    idle = [window - busy for window, busy in zip(windows, compute)]
    bubbles = [rank_idle / window for rank_idle, window in zip(idle, windows)]
    summary = {
        "bubble_measured": sum(bubbles) / world, "bubble_per_rank": bubbles,
        "compute_ms": [1e3 * busy / len(measured) for busy in compute],
        "idle_ms": [1e3 * rank_idle / len(measured) for rank_idle in idle],
        "peak_inflight_microbatches": inflight,
        "expected_inflight_microbatches": [expected_inflight(rank) for rank in range(world)],
        "peak_activation_bytes": [rank.activation_peak for rank in ranks],
        "peak_held_bytes": [rank.held_peak for rank in ranks],
    }
    if any(reduced):
        summary["allreduce_ms"] = [1e3 * time / len(measured) for time in reduced]
        summary["allreduce_hidden_ms"] = [1e3 * time / len(measured) for time in hidden]
    tp = [[span for span in rank.spans if span.kind == TP and span.step in measured] for rank in ranks]
    if any(tp):  # 08's, a step: how long, how many, and the bytes of the tensors they made
        summary["tp_allreduce_ms"] = [1e3 * sum(s.end - s.start for s in spans) / len(measured) for spans in tp]
        summary["tp_allreduces"] = [len(spans) // len(measured) for spans in tp]
        summary["tp_allreduce_bytes"] = [sum(span.nbytes for span in spans) // len(measured) for spans in tp]
    if recorder.device.type == "cuda":
        summary["cuda_max_memory_allocated"] = [rank.cuda_peak for rank in ranks]
    return summary


def _peak_inflight(work):
    """Most (micro-batch, chunk) pairs between the start of their forward and the end of their last
    backward or weight-gradient span."""
    begin, end = {}, {}
    for span in work:
        pair = span.micro_batch, span.chunk
        if span.kind == "forward":
            begin[pair] = span.start
        else:
            end[pair] = max(end.get(pair, span.end), span.end)
    events = sorted([(time, 1) for time in begin.values()] + [(time, -1) for time in end.values()])
    return max(itertools.accumulate((change for _, change in events), initial=0))  # the most alive at once


def _compare(args, summary, ranks, measured):
    """The busiest rank against the theory and against this run's order replayed at its mean span
    times, the sends posted before their receive, and each rank's step in parts beside the step's limit (_account),
    over the measured steps. Returns each rank's stretches (_account), for --trace."""
    num_stages = len(ranks) // args.data_parallel  # ranks in a pipeline (08: a copy, its stages' shards in step)
    busiest = max(range(len(ranks)), key=lambda rank: summary["compute_ms"][rank])
    summary["busiest_rank"], summary["bubble_busiest"] = busiest, summary["bubble_per_rank"][busiest]
    lengths = defaultdict(list)  # (stage, kind) -> the run's spans of it
    for rank, stages in zip(ranks, _stages(ranks)):
        for span in (span for span in rank.spans if span.kind in COMPUTE and span.step in measured):
            lengths[stages[span.chunk], span.kind].append(span.end - span.start)
    mean_ms = lambda times: 1e3 * sum(times) / len(times)  # noqa: E731
    summary["span_ms"] = {kind: mean_ms([time for (_, of), times in lengths.items() if of == kind for time in times])
                          for kind in COMPUTE if any(of == kind for _, of in lengths)}
    at_costs = [{kind: mean_ms(lengths[stage, kind]) if lengths[stage, kind] else ms
                 for kind, ms in summary["span_ms"].items()} for stage in range(len(args.blocks))]
    summary["bubble_at_costs"] = _replayed(ranks, measured[-1], num_stages, at_costs)[busiest]
    if "bubble_theory" not in summary:  # no closed form for it: the schedule's order at the paced spans, the
        paced = theory.paced_spans(theory.counted_costs(args.blocks, args.hidden, args.classes))  # busiest rank's
        summary["bubble_theory_per_rank"] = _replayed(ranks, measured[-1], num_stages, paced)
        summary["bubble_theory"] = min(summary["bubble_theory_per_rank"])
    summary["sends_before_receive"] = _sends_before_receive(ranks, measured)
    summary["sent_bytes"] = [sum(post.nbytes for post in rank.posts if post.is_send and post.step in measured)
                             // len(measured) for rank in ranks]
    summary["pace_ms"], summary["paced_overruns"] = args.pace, sum(rank.overruns for rank in ranks)
    return _account(summary, ranks, measured, num_stages, at_costs)


def _replayed(ranks, step, num_stages, span_ms):
    """Each rank's bubble if every pipeline ran the order its ranks computed in `step`, with every
    span of a kind on a stage taking span_ms[stage][kind]. Stages are ordered by their first layer."""
    bubbles, stages = [], _stages(ranks)
    for first in range(0, len(ranks), num_stages):
        bubbles += theory.bubbles(_orders(ranks, step, first, num_stages),
                                  lambda rank, chunk: stages[first + rank][chunk], len(span_ms), span_ms)
    return bubbles


def _orders(ranks, step, first, num_stages):
    """The order of (kind, chunk, micro_batch) each rank of the pipeline from rank `first` computed in `step`."""
    return [[(span.kind, span.chunk, span.micro_batch) for span in sorted(rank.spans, key=lambda s: s.start)
             if span.step == step and span.kind in COMPUTE] for rank in ranks[first:first + num_stages]]


def _account(summary, ranks, measured, num_stages, span_ms):
    """Each rank's step in PARTS that add up to it (step_parts_ms, ms), the mean step (step_ms_mean) and the step's
    limit (step_limit_ms), over the measured steps (_windows). The replay (theory.replay) runs the pipeline's order
    in the last measured step at span_ms (each stage's mean spans), each message taking the measured latency. Steps
    follow one another, so a rank's outside must fit between its last computation of a step and its first of the
    next: the limit is the replay's length less the rank's idle time before its first computation and after its
    last, plus its outside, for the rank where that is most. Returns each rank's stretches, for --trace."""
    stages, message_ms, windows = _stages(ranks), summary["message_latency_ms"], _windows(ranks, measured)
    stretches, limits = [[] for _ in ranks], []
    for first in range(0, len(ranks), num_stages):
        pipeline = ranks[first:first + num_stages]
        orders = _orders(ranks, measured[-1], first, num_stages)
        stage_of = lambda rank, chunk: stages[first + rank][chunk]  # noqa: E731
        replay = theory.replay(orders, stage_of, len(span_ms), span_ms, message_ms)
        length = max(end for _, end in replay.values()) / 1e3  # seconds, as the spans
        idle = [_replayed_idle(order, replay, length, lambda chunk: stage_of(rank, chunk))
                for rank, order in enumerate(orders)]
        outsides = [_between_steps(rank) for rank in pipeline]
        outside = [sum(s.end - s.start for s in _clipped(rank, windows)) / len(measured) for rank in outsides]
        limit = max(length - at_ends + rank_outside for (_, at_ends), rank_outside in zip(idle, outside))
        for rank, ((between, at_ends), rank_outside) in enumerate(zip(idle, outside)):
            ends = limit - (length - at_ends) - rank_outside  # the idle time the limit leaves the rank at its ends
            stretches[first + rank] = _clipped(_stretches(pipeline[rank], outsides[rank], between, ends), windows)
        limits.append(limit)
    summary["step_ms_mean"] = 1e3 * sum(end - start for start, end in windows) / len(measured)
    summary["step_parts_ms"] = [{part: 1e3 * sum(s.end - s.start for s in rank if s.part == part) / len(measured)
                                 for part in PARTS} for rank in stretches]
    summary["step_limit_ms"] = 1e3 * max(limits)
    return stretches


def _windows(ranks, measured):
    """Each measured step, (start, end) on rank 0's clock: from the end of the last computation anywhere in the
    previous step (where that step has no spans, --overhead, the first rank's start of this one) to the end of the
    last in this one. Steps so cut follow one another, and each lasts the run's period, the same on every rank."""
    last = defaultdict(lambda: -math.inf)  # step -> the end of its last computation
    for span in (span for rank in ranks for span in rank.spans if span.kind in COMPUTE):
        last[span.step] = max(last[span.step], span.end)
    return [(last[step - 1] if step - 1 in last else min(t.start for rank in ranks for t in rank.steps
                                                          if t.step == step), last[step]) for step in measured]


def _between_steps(rank):
    """The Stretches a rank is outside its steps: from its last computation or wait in a step to its first in the
    next (each step with spans), and before its first and after its last."""
    edges = defaultdict(list)  # step -> the starts and ends of its spans
    for span in rank.spans:
        edges[span.step] += [span.start, span.end]
    ends = [-math.inf] + [edge for step in sorted(edges) for edge in (min(edges[step]), max(edges[step]))] + [math.inf]
    return [Stretch("outside", start, end) for start, end in zip(ends[::2], ends[1::2])]


def _replayed_idle(order, replay, length, stage_of):
    """Seconds the replay (theory.replay's, in ms; `length` seconds long) leaves a rank idle: before each of its
    computations but the first, from the previous one's end, by (kind, chunk, micro_batch); and at its ends,
    before its first computation and after its last."""
    between, previous_end = {}, None
    for kind, chunk, micro_batch in order:
        start, end = (time / 1e3 for time in replay[kind, stage_of(chunk), micro_batch])
        if previous_end is None:
            before_first = start
        else:
            between[kind, chunk, micro_batch] = start - previous_end
        previous_end = end
    return between, before_first + length - previous_end


def _stretches(rank, outside, between, ends):
    """A rank's whole run cut into Stretches, each instant in one part: outside, between steps (_between_steps's);
    compute, in a computation; else waiting, in a wait or a collective; else runtime, the runtime's own. Waiting is
    schedule_wait for as long as the replay idles there, extra_wait beyond: before a computation, for between[it];
    before a step's first computation (and after the last), for `ends` (the replay's idle time at the rank's ends,
    less its outside)."""
    waiting = [Stretch("wait", *interval) for interval in _union([(span.start, span.end) for span in rank.spans
                                                                    if span.kind not in COMPUTE])]
    covered = sorted(waiting + outside, key=lambda stretch: stretch.start)
    computations = sorted((span for span in rank.spans if span.kind in COMPUTE), key=lambda span: span.start)
    stretches, done = [], -math.inf  # the end of the last computation so far
    for previous, computation in zip([None] + computations, computations + [None]):
        if computation is None or previous is None or previous.step != computation.step:
            schedule = ends
        else:
            schedule = between[computation.kind, computation.chunk, computation.micro_batch]
        for start, end, part in _pieces(done, math.inf if computation is None else computation.start, covered):
            if part != "wait":
                stretches.append(Stretch(part or "runtime", start, end))
                continue
            expected = min(end, start + schedule)  # the schedule's waiting comes first, then the extra
            stretches += [Stretch("schedule_wait", start, expected), Stretch("extra_wait", expected, end)]
            schedule -= expected - start
        if computation is not None:
            stretches.append(Stretch("compute", max(done, computation.start), computation.end))
            done = max(done, computation.end)
    return stretches


def _clipped(stretches, windows):
    """The parts of Stretches within windows, (start, end) in order: each cut at the windows' edges."""
    starts, clipped = [low for low, _ in windows], []
    for stretch in stretches:
        first = max(0, bisect.bisect(starts, stretch.start) - 1)  # the window it starts in (or the first)
        for low, high in windows[first:bisect.bisect(starts, stretch.end)]:
            if max(stretch.start, low) < min(stretch.end, high):
                clipped.append(stretch._replace(start=max(stretch.start, low), end=min(stretch.end, high)))
    return clipped


def _union(intervals):
    """Intervals (start, end) merged where they overlap, in order."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = merged[-1][0], max(merged[-1][1], end)
        else:
            merged.append((start, end))
    return merged


def _pieces(start, end, covered):
    """[start, end] cut at the edges of `covered` (Stretches, disjoint, in order): (start, end, part) in order, the
    part None where nothing covers."""
    pieces = []
    for stretch in covered[bisect.bisect(covered, start, key=lambda stretch: stretch.end):]:  # those ending after start
        if stretch.start >= end:
            break
        low, high = max(stretch.start, start), min(stretch.end, end)
        if low < high:
            pieces += [(start, low, None), (low, high, stretch.part)]
            start = high
    return pieces + [(start, end, None)]


def _sends_before_receive(ranks, measured):
    """Per rank, how many of its sends in the measured steps were posted before their receive. A send
    is matched with its receive by sender, receiver, tag and order, as gloo matches them."""
    sends, receives = defaultdict(list), defaultdict(list)  # (step, sender, receiver, tag) -> when each was posted
    for rank, records in enumerate(ranks):
        for post in (post for post in records.posts if post.step in measured):
            sender, receiver = (rank, post.peer) if post.is_send else (post.peer, rank)
            (sends if post.is_send else receives)[post.step, sender, receiver, post.tag].append(post.time)
    early = [0] * len(ranks)
    for (step, sender, receiver, tag), times in sends.items():
        early[sender] += sum(sent < received for sent, received in zip(times, receives[step, sender, receiver, tag]))
    return early


def _table(summary, layers):
    """A row per rank (layers: each rank's chunks' (first, last)), then the run's lines."""
    n, column = summary["world_size"], lambda key, form="": [format(value, form) for value in summary[key]]
    columns = [("rank", range(n)), ("layers", [",".join(f"{first}-{last - 1}" for first, last in chunks)
                                               for chunks in layers]),
               ("cost", column("counted_cost", ".4g")), ("compute ms", column("compute_ms", ".1f")),
               ("idle ms", column("idle_ms", ".1f")),
               ("bubble", column("bubble_per_rank", ".3f")), ("theory", column("bubble_theory_per_rank", ".3f")),
               ("in flight", column("peak_inflight_microbatches")),
               ("theory", column("expected_inflight_microbatches")),
               ("activations", [_bytes(count) for count in summary["peak_activation_bytes"]]),
               ("held", [_bytes(count) for count in summary["peak_held_bytes"]])]
    columns += [(header, column(key, ".1f")) for header, key in (  # ms a step
        ("all-reduce", "allreduce_ms"), ("hidden", "allreduce_hidden_ms"), ("TP", "tp_allreduce_ms")) if key in summary]
    if "expected_parameter_bytes" in summary:  # 08's, in bytes
        columns += [("params", column("parameter_bytes")), ("theory", column("expected_parameter_bytes"))]
    lines = [" ".join(f"{header:>11}" for header, _ in columns)]
    lines += [" ".join(f"{values[rank]:>11}" for _, values in columns) for rank in range(n)]
    if "cuda_max_memory_allocated" in summary:
        lines.append("torch.cuda.max_memory_allocated per rank: " +
                     ", ".join(_bytes(b) for b in summary["cuda_max_memory_allocated"]))
    lines.append(f"step time (median) {summary['step_ms_median']:.1f} ms, bubble {summary['bubble_measured']:.3f} "
                 f"measured (mean over ranks), {summary['bubble_theory']:.3f} in theory; busiest rank "
                 f"{summary['busiest_rank']}: {summary['bubble_busiest']:.3f}")
    lines.append(_bound(summary))
    if "allreduce_ms" in summary:
        lines.append("all-reduce: ms a step from the start of the rank's gradient all-reduce to its end; hidden: "
                     "the part of it within its pipeline's span (the first forward to the last computation)")
    costs = ", ".join(f"{pictures.LETTERS[kind]} {ms:.2f}" for kind, ms in summary["span_ms"].items())
    lines.append(f"at this run's mean span times ({costs} ms) the theory is {summary['bubble_at_costs']:.3f}")
    lines.append(f"sends posted before their receive, per rank: {summary['sends_before_receive']} (gloo parks such a "
                 "send and moves it later on a background thread, which needs a free core)")
    if summary["pace_ms"]:
        lines.append(f"--pace {summary['pace_ms']:g}: every computation padded to {summary['pace_ms']:g} ms"
                     + (f"; {summary['paced_overruns']} took longer" if summary["paced_overruns"] else ""))
    lines += ["--recompute: from F to B each micro-batch keeps only its stage's input"] * summary["recompute"]
    if "step_ms_median_bare" in summary:
        instrumented, bare = summary["step_ms_median"], summary["step_ms_median_bare"]
        lines.append(f"--overhead: {instrumented:.1f} ms a step instrumented (even steps), {bare:.1f} ms bare "
                     f"(odd steps), medians: {100 * (instrumented / bare - 1):+.1f}%")
    step, limit = summary["step_ms_mean"], summary["step_limit_ms"]
    lines.append(f"step (mean) {step:.1f} ms on the busiest rank {summary['busiest_rank']}: " + ", ".join(
        f"{part} {ms:.1f}" for part, ms in summary["step_parts_ms"][summary["busiest_rank"]].items()) + " ms")
    lines.append(f"limit {limit:.1f} ms (this order at its mean spans, each message {summary['message_latency_ms']:.3f}"
                 f" ms as measured, plus outside): {step - limit:.1f} ms a step beyond it, the runtime's (within "
                 "extra_wait + runtime)")
    return "\n".join(lines)


def _bound(summary):
    """The line on the stage that bounds the step, and where it costs far more than the mean stage under
    --partition even, the flag that shares the blocks out by cost."""
    costs, stage = summary["stage_costs"], summary["bounding_stage"]
    ratio = costs[stage] / (sum(costs) / len(costs))
    line = (f"cost: each rank's F + I + W a step, counted in block forwards; stage {stage} bounds the step at "
            f"{costs[stage]:.4g} a micro-batch, {ratio:.2f}x the mean stage")
    if ratio >= 1.25 and summary["partition"] == "even":
        line += (f"; the other stages wait on it: --partition balanced shares the blocks out by cost "
                 f"(the head alone costs {summary['classes'] / summary['hidden']:.3g} blocks' worth)")
    return line


def _bytes(count):
    return f"{count / 2**20:.2f} MiB" if count >= 2**20 else f"{count / 2**10:.1f} KiB"
