"""Paced runs (--pace): every computation padded to the same time, so the measured bubble is the
schedule's own. The busiest rank's must equal the theory, derived here independently of the scripts,
within 0.03; a schedule that waits where it need not must miss it; and the count of sends posted
before their receive must be the one counted by hand."""

import pytest

from conftest import EXACT, SYNC, assert_close, case_ids, pipelined, size, variant

PACE = ("--pace", "50")
TOLERANCE = 0.03


def slots(orders):
    """Unit-time slots a pipeline needs to run each rank's order, (kind, micro_batch, stage) in turn, when
    a computation may start in the slot after its input was computed: a forward's in the previous stage,
    a backward's in the next stage (on the last stage, its own forward), a weight gradient's its B."""
    finished, time, position = {}, 0, [0] * len(orders)
    last = max(stage for order in orders for _, _, stage in order)
    while any(p < len(order) for p, order in zip(position, orders)):
        ran = []
        for rank, order in enumerate(orders):
            if position[rank] < len(order):
                kind, micro_batch, stage = order[position[rank]]
                needs = {"F": ("F", micro_batch, stage - 1) if stage else None,
                         "B": ("B", micro_batch, stage + 1) if stage < last else ("F", micro_batch, stage),
                         "W": ("B", micro_batch, stage)}[kind]
                if needs is None or finished.get(needs, time) < time:
                    ran.append((rank, (kind, micro_batch, stage)))
        for rank, done in ran:
            finished[done] = time
            position[rank] += 1
        time += 1
    return time


def interleaved_orders(n, m, v):
    """Megatron-LM's order on each rank: the table of (micro-batch, chunk) in groups of n, holes where
    m is not a multiple of n, warm-up (v - 1) n + 2 (n - r - 1), then one forward and one backward."""
    padded = -(-m // n) * n if v > 1 else m
    table = [(group + i, chunk) for group in range(0, padded, n) for chunk in range(v) for i in range(n)]
    orders = []
    for rank in range(n):
        warmup = min((v - 1) * n + 2 * (n - rank - 1) if v > 1 else n - rank - 1, len(table))
        forwards = [("F", micro_batch, chunk * n + rank) for micro_batch, chunk in table]
        backwards = [("B", micro_batch, (v - 1 - chunk) * n + rank) for micro_batch, chunk in table]
        order = forwards[:warmup]
        for i in range(len(table) - warmup):
            order += [forwards[warmup + i], backwards[i]]
        order += backwards[len(table) - warmup:]
        orders.append([entry for entry in order if entry[1] < m])  # holes compute nothing
    return orders


def theory(script, n, m, v=1):
    """The bubble with every computation one unit long."""
    if script == "01_naive.py":
        return (n - 1) / n
    if script in ("02_gpipe.py", "03_1f1b.py"):
        return (n - 1) / (m + n - 1)
    if script == "05_zero_bubble.py":  # rank 0 waits 2n - 1 for its first B; ZB-H1 fills the rest
        return 1 - 3 * m / max(3 * m + n - 1, 2 * m + 2 * n - 1)
    return 1 - 2 * m * v / slots(interleaved_orders(n, m, v))


# (script, world, micro-batches, virtual stages, layers, flags): worlds 2-4; m below, at and above n;
# m that n does not divide (04's holes); some under --sync-sends.
CASES = [
    ("01_naive.py", 3, 1, 1, 7, ()),
    ("02_gpipe.py", 4, 3, 1, 7, ()), ("02_gpipe.py", 2, 5, 1, 7, SYNC),
    ("03_1f1b.py", 2, 1, 1, 7, ()), ("03_1f1b.py", 4, 4, 1, 7, ()), ("03_1f1b.py", 3, 7, 1, 7, SYNC),
    ("04_interleaved_1f1b.py", 4, 8, 2, 9, ()), ("04_interleaved_1f1b.py", 3, 4, 2, 7, SYNC),
    ("04_interleaved_1f1b.py", 2, 3, 3, 7, ()), ("04_interleaved_1f1b.py", 4, 2, 2, 9, ()),
    ("05_zero_bubble.py", 4, 8, 1, 7, ()), ("05_zero_bubble.py", 3, 2, 1, 7, SYNC),
    ("05_zero_bubble.py", 2, 5, 1, 7, ()),
]


def paced(runs, script, world, micro_batches, virtual_stages, layers, flags, path=None):
    chunks = ("--virtual-stages", str(virtual_stages)) if script.startswith("04") else ()
    return pipelined(runs, path or script, world, micro_batches, *chunks, *PACE, *flags, size=size(layers))


@pytest.mark.parametrize("script,world,micro_batches,virtual_stages,layers,flags", CASES,
                         ids=case_ids(CASES, "", "n", "m", "v", "L"))
def test_paced_bubble_is_the_theory(runs, script, world, micro_batches, virtual_stages, layers, flags):
    run = paced(runs, script, world, micro_batches, virtual_stages, layers, flags)
    expected = theory(script, world, micro_batches, virtual_stages)
    summary = run.summary
    assert summary["bubble_theory"] == pytest.approx(expected, abs=1e-9), "the script's own theory"
    assert summary["bubble_at_costs"] == pytest.approx(expected, abs=0.01), "its order, replayed"
    assert abs(summary["bubble_busiest"] - expected) <= TOLERANCE, (summary["bubble_per_rank"], expected)
    assert summary["paced_overruns"] == 0
    # pacing only sleeps: the arithmetic is the baseline's
    assert_close(run.grads, runs("00_baseline.py", 0, *size(layers)).grads, EXACT, "paced gradients")


# 05 running each W after the pair it should overlap has arrived (every group waited for as soon as it is
# posted): W no longer fills the wait.
W_AFTER_THE_PAIR = """import common

_post = common.post


class Arrived:
    def __init__(self, tensors):
        self.tensors = tensors

    def wait(self):
        return self.tensors


common.post = lambda *operations: Arrived(_post(*operations).wait())
"""


def test_waiting_where_it_need_not_misses_the_theory(runs, tmp_path):
    slow = variant(tmp_path, "05_zero_bubble.py", prepend=W_AFTER_THE_PAIR)
    run = paced(runs, "05_zero_bubble.py", 4, 8, 1, 7, (), path=slow)
    assert run.summary["bubble_busiest"] - theory("05_zero_bubble.py", 4, 8) > TOLERANCE


def test_sends_before_receive_counted_by_hand(runs):
    """03 on 2 ranks with 2 micro-batches, paced, each step: rank 0 sends F0 at the end of slot 0 to rank 1,
    which has waited for it since the step began; F1 at the end of slot 1, while rank 1 runs F0, whose
    receive of F1 is posted with its send of B0 at the end of slot 2: early. Rank 1 sends B0 at the end of
    slot 2 and B1 at the end of slot 4, each after rank 0 posted its receive (at the end of slot 1 with
    F1's send, and of slot 3, B0). So 1 early send a step on rank 0, none on rank 1: 2 in the 2 measured steps."""
    run = pipelined(runs, "03_1f1b.py", 2, 2, *PACE)
    assert run.summary["sends_before_receive"] == [2, 0]
