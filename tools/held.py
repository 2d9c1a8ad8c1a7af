"""The held-bytes model: each rank's peak bytes held, in units of one micro-batch's rows x hidden activation, as
tools/measure.py and the tests compare a run's peak_held_bytes with it (docs/design.md, *Memory*). It models the
runtime loop's own object lifetimes, so it is the lab's, not the lesson's.

held_theory   02's, 03's and 05's closed forms
held_count    the same counted over any table (06, 09)
weight_share  what W still needs of what F held (the zero-bubble paper's M_W / M_B): tools/plan.py's default
"""

import theory


def held_theory(script, n, m, blocks, rows, hidden, recompute=False, classes=10):
    """Each rank's peak held bytes (docs/design.md, *Memory* and *Recomputation*), in units of one micro-batch's
    rows x hidden activation, for 02, 03 and 05 with m > n and `blocks` = L >= 2 blocks a stage (06's and 09's:
    held_count, over their tables). A micro-batch in flight holds from F to its B (05: its I) its input and its
    blocks' ReLU outputs, L + 1 units, or with --recompute its input alone (rank 0's input is a slice of the
    batch, counted only while autograd or W keeps it), and during that B or I the recomputed L; from I to W (05)
    each Linear's input and output gradient, 2L. Those in transit are the tensors the loop's variables keep (a
    gradient received, an activation and a gradient sent, until the next iteration) and, in GPipe, the
    activations sent, let go of once the first gradient is back. The last stage adds its loss's saved tensors,
    `extra` (rows x classes log-probabilities, the rows' labels, a total weight), and W the head's gradient,
    `head`."""
    if script not in ("02_gpipe.py", "03_1f1b.py", "05_zero_bubble.py"):
        raise ValueError(f"held_theory counts 02, 03 and 05, not {script}: count its table with held_count.")
    extra, head = ((classes + 1) * rows + 1) / (rows * hidden), classes / hidden
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
        else:  # 05, in an I: the r W's pending and its own (its 2L, and its output a moment more), the inputs waiting
            # for their I; in transit a gradient received (and one sent) and, with --recompute, the activation sent
            waiting = (n - rank - 1) * ((0 if first else 1) if recompute else L + 1)
            peak = waiting + 2 * L * (rank + 1) + 1 + (1 if first else 2) + recompute
        peaks.append(peak)
    return peaks


def weight_share(blocks):
    """The share of a micro-batch's held activations that its I leaves for its W (M_W / M_B in the zero-bubble
    paper, which calls I 'B'), as held_count counts them on a stage of `blocks` = L blocks (the head's stage aside):
    from F to I its input and its blocks' ReLU outputs, L + 1 units; from I to W each Linear's input and output
    gradient, 2L. Above 1 from L = 2 on: in this MLP an I adds to what its F held (of that only the last block's
    output goes, which no Linear of the stage reads, and the output gradients come)."""
    return 2 * blocks / (blocks + 1)


def held_count(tables, placement, blocks, rows, hidden, recompute=False, classes=10):
    """06's and 09's peaks, counted over their tables at one unit a computation (a full backward two, its I then
    its W), in rows x hidden units; blocks[s]: stage s's blocks (docs/design.md, *ZB-V*, held bytes). A chunk holds
    its input and its blocks' outputs from F to I (with --recompute its input alone, and the recomputed
    outputs during I), and its Linears' inputs and output gradients from I to W; I keeps those gradients a
    moment before autograd lets go of the rest. A tensor between two ranks is held by its receiver from the
    moment it is made, and by its sender (a gradient; with --recompute an activation too, which no longer is a
    saved output) until it is used or, sooner, until the sender uses a tensor from that peer made no earlier
    than it (guarantees.release_on_arrival); the loop's `result` keeps the last F's, I's or B's until the next ends.
    The last stage holds its rows x classes log-probabilities from F to I and their gradient from I to W, and its
    loss the rows' labels and a total weight from F until its I begins (micro-batches of rows x hidden numbers)."""
    head, labels = classes / hidden, (rows + 1) / (rows * hidden)
    n = len(tables)
    num_stages = n * (1 + max(chunk for table in tables for _, chunk, _ in table))
    stage_of = lambda rank, chunk: theory.stage(placement, n, rank, chunk)  # noqa: E731
    rank_of = {stage_of(rank, chunk): rank for rank, table in enumerate(tables) for _, chunk, _ in table}.get
    spans = theory.replay(tables, stage_of, num_stages)

    def span(where, direction, i):
        """(start, when its result is out) of stage `where`'s forward (direction "forward") or its backward."""
        kinds = ("forward",) if direction == "forward" else theory.BACKWARDS
        return next(spans[kind, where, i] for kind in kinds if (kind, where, i) in spans)

    events = [[] for _ in range(n)]  # per rank: (time, order within the moment, what, stage, micro-batch)
    for rank, table in enumerate(tables):
        for kind, chunk, i in table:
            where, direction = stage_of(rank, chunk), "forward" if kind == "forward" else "backward"
            events[rank].append((spans[kind, where, i][0], 1, kind, where, i))
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
            source = where - 1 if what == "forward" else where + 1 if what in theory.BACKWARDS else -1
            if 0 <= source < num_stages and rank_of(source) != rank:  # its input waited for: older sends there let go
                made = span(source, "forward" if what == "forward" else "backward", i)[1]
                for tensor, peer, when in sent:
                    if peer == rank_of(source) and when <= made:
                        drop(tensor, "transit")
            # a stage's input: the data, its own rank's previous chunk's output, or a received tensor
            given = ("data", i) if where == 0 else ("out", where - 1, i) if rank_of(where - 1) == rank \
                else ("in", where, i)
            made_in = "again" if recompute else "out"  # --recompute: an I or a B makes the outputs again, new tensors
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
            elif what in theory.BACKWARDS:
                drop(("labels", i), ("F", where, i))  # the loss lets go of them first, as its backward begins
                if recompute:  # the forward again: the I or B holds what F held without the flag
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
            if what in ("forward", *theory.BACKWARDS):  # the new result replaces the loop's `result`
                drop(result, "result")
                result = ("out", where, i) if what == "forward" else ("grad", where, i)
                if (where < num_stages - 1) if what == "forward" else (where > 0):  # not the loss, nor nothing
                    hold(result, "result")
            if what in ("weight", "full_backward", "overlapped_backward"):  # a full backward's W: right after its I
                peak = max(peak, held())
                for tensor in holders:
                    drop(tensor, ("W", where, i))
            peak = max(peak, held())
        peaks.append(peak)
    return peaks
