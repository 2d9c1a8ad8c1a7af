"""The run drawn: its last step as text and as an SVG (a row per rank, time left to right, idle left
blank), and every span as a Chrome trace."""

import json
import shutil

from harness.meters import COMPUTE, TP

LETTERS = {"forward": "F", "backward": "I", "weight": "W", "full_backward": "B", "allreduce": "AR", TP: "TP"}
# after a label, in the timeline
FILLS = {"forward": "-", "backward": "=", "weight": "~", "full_backward": "=", "allreduce": "+", TP: "#"}
COLOURS = {"forward": "#4e79a7", "backward": "#59a14f", "weight": "#f28e2b", "full_backward": "#59a14f",
           "allreduce": "#9c9c9c", TP: "#e15759"}


def _label(span, num_chunks):
    """PyTorch's letters, as tools/draw.py draws a table: F3 (micro-batch 3), B3 a full backward, I3 and W3 a split
    one's halves; a rank's second chunk of two in small letters (f3), with more chunks .c after the micro-batch
    (F3.2); AR for the gradient all-reduce, TP for 08's."""
    if span.kind not in COMPUTE:
        return LETTERS[span.kind]
    letter = LETTERS[span.kind]
    letter = letter.lower() if num_chunks == 2 and span.chunk == 1 else letter
    return f"{letter}{span.micro_batch}" + (f".{span.chunk}" if num_chunks > 2 else "")


def _last_step(spans):
    """The last recorded step: its number, each rank's spans but its waits, their start and length."""
    step = max(span.step for rank in spans for span in rank)
    rows = [[span for span in rank if span.step == step and span.kind != "wait"] for rank in spans]
    start = min(span.start for row in rows for span in row)
    return step, rows, start, max(span.end for row in rows for span in row) - start


def timeline(spans, num_chunks):
    """The last recorded step as text. spans: each rank's; num_chunks: the model chunks a rank holds."""
    step, rows, start, length = _last_step(spans)
    width = max(40, shutil.get_terminal_size().columns - 10)
    kinds = {span.kind for row in rows for span in row}
    legend = "F forward, " + ("I input gradient, W weight gradient" if "weight" in kinds else "B backward")
    legend += (", AR gradient all-reduce" if "allreduce" in kinds else "") + (", # TP in F or B" if TP in kinds else "")
    chunk_legend = {1: "", 2: ", small letters chunk 1"}.get(num_chunks, ", .c model chunk c")
    lines = [f"timeline of step {step} ({1e3 * length:.1f} ms; {legend}{chunk_legend}; blank idle):"]
    for rank, row in enumerate(rows):
        line, taken = [" "] * width, 0
        for span in sorted(row, key=lambda span: (span.kind == TP, span.start)):  # TP last, over its F's or B's fill
            first = int((span.start - start) / length * width)
            first = first if span.kind == TP else max(taken, first)  # never draw over the previous span
            last = min(width, max(first + 1, round((span.end - start) / length * width)))
            if span.kind == TP:  # inside its F or B: over the fill, never over a label
                line[first:last] = [FILLS[TP] if char in "-=" else char for char in line[first:last]]
            else:
                line[first:last] = (_label(span, num_chunks) + FILLS[span.kind] * width)[: last - first]
                taken = last
        lines.append(f"rank {rank:2d} |{''.join(line).rstrip()}")
    return "\n".join(lines)


def write_svg(path, spans, num_chunks, summary):
    """The last recorded step as a picture: a box per computation (and per all-reduce)."""
    step, rows, start, length = _last_step(spans)
    left, width, height = 70, max(960, 36 * max(len(row) for row in rows)), 26  # room for each box's label
    scale = lambda time: left + (time - start) / length * width  # noqa: E731
    copies, shards = summary["data_parallel"], summary["tensor_parallel"]
    shape = (f"{summary['world_size'] // copies // shards} stages x {copies} copies" if copies > 1
             else f"n = {summary['world_size'] // shards}") + f", t = {shards}" * (shards > 1)
    title = (f"{summary['script']}: {shape}, m = {summary['num_microbatches']}"
             + (f", v = {summary['virtual_stages']}" if num_chunks > 1 else "")
             + (f", --pace {summary['pace_ms']:g}" if summary["pace_ms"] else "")
             + f"; step {step}, {1e3 * length:.0f} ms; bubble of the busiest rank {summary['bubble_busiest']:.3f},"
             f" theory {summary['bubble_theory']:.3f}")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 10}" '
             f'height="{height * (len(rows) + 1) + 10}" font-family="monospace" font-size="11">',
             f'<rect width="100%" height="100%" fill="white"/><text x="4" y="16">{title}</text>']
    for rank, row in enumerate(rows):
        y = height * (rank + 1)
        parts.append(f'<text x="4" y="{y + 17}">rank {rank}</text>')
        for span in sorted(row, key=lambda span: span.kind == TP):  # TP over its F or B
            x, w = scale(span.start), max(1.0, scale(span.end) - scale(span.start))
            label = _label(span, num_chunks)
            parts.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{height - 6}" '
                         f'fill="{COLOURS[span.kind]}" stroke="white"/>')
            if w > 7 * len(label):  # a label that fits its box
                parts.append(f'<text x="{x + w / 2:.1f}" y="{y + 17}" fill="white" text-anchor="middle">{label}</text>')
    with open(path, "w") as file:
        file.write("\n".join(parts + ["</svg>"]) + "\n")


def write_trace(path, spans, chunks, stages, other, stretches):
    """Chrome trace format: one process per rank, one complete ("X") event per span, its stage in its args (stages:
    each rank's chunks' stages); under it, a row of the rank's step in its parts (stretches: each rank's, summary's
    Stretch), as begin and end events; `other` in otherData: each stage's blocks, the steps measured (the first
    pays for warm-up) and a message's latency (tools/plan.py --costs-from reads them all)."""
    origin = min(span.start for rank in spans for span in rank)
    events = []
    for rank, rows in enumerate(spans):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": 1, "args": {"name": "step in parts"}})
        for stretch in stretches[rank]:  # "B" and "E", not "X": readers of the spans take only complete events
            events += [{"name": stretch.part, "cat": stretch.part, "ph": phase, "pid": rank, "tid": 1,
                        "ts": 1e6 * (time - origin)} for phase, time in (("B", stretch.start), ("E", stretch.end))]
        for span in rows:
            name = f"{span.kind} {span.micro_batch}" + (f".{span.chunk}" if chunks else "")
            events.append({"name": name if span.kind in COMPUTE else span.kind, "cat": span.kind, "ph": "X",
                           "pid": rank, "tid": 0, "ts": 1e6 * (span.start - origin),
                           "dur": 1e6 * (span.end - span.start),
                           "args": {"step": span.step, "micro_batch": span.micro_batch, "chunk": span.chunk,
                                    "stage": stages[rank][span.chunk]}})
    with open(path, "w") as file:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}, file)
