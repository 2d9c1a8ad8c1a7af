"""Paced runs (--pace): every computation padded to the same time, so the measured bubble is the
schedule's own. The busiest rank's must equal the theory (the script's table replayed at one unit a
computation, which the script's closed form must also equal) within 0.03; a schedule that waits where it
need not must miss it; and the count of sends posted before their receive must be the one counted by hand."""

import pytest

import schedules
from tests.launch import EXACT, SYNC, assert_close, case_ids, paced_theory, pipelined, program, settled, size, variant

PACE = ("--pace", "50")
TOLERANCE = 0.03


# The table each script runs (01: GPipe's with one micro-batch); tests/test_schedules.py proves them its order.
TABLES = {"01_naive.py": lambda n, m, v: schedules.gpipe(n, 1),
          "02_gpipe.py": lambda n, m, v: schedules.gpipe(n, m),
          "03_1f1b.py": lambda n, m, v: schedules.one_f_one_b(n, m),
          "04_interleaved_1f1b.py": schedules.interleaved_1f1b,
          "05_zero_bubble.py": lambda n, m, v: schedules.zb_h1(n, m)}


def theory(script, n, m, v, layers):
    """The busiest rank's bubble when the script's table is replayed at --pace's spans: each stage's counted cost
    over the mean stage's (a B, or 05's I, is one span in 01-05)."""
    return paced_theory(TABLES[script](n, m, v), "loop", layers)


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


def paced(runs, script, world, micro_batches, virtual_stages, layers, flags, path=None, pace=PACE):
    chunks = ("--virtual-stages", str(virtual_stages)) if script.startswith("04") else ()
    return pipelined(runs, path or script, world, micro_batches, *chunks, *pace, *flags, size=size(layers))


@pytest.mark.parametrize("script,world,micro_batches,virtual_stages,layers,flags", CASES,
                         ids=case_ids(CASES, "", "n", "m", "v", "L"))
def test_paced_bubble_is_the_theory(runs, again, script, world, micro_batches, virtual_stages, layers, flags):
    expected = theory(script, world, micro_batches, virtual_stages, layers)

    def start(runner, pace):
        return paced(runner, script, world, micro_batches, virtual_stages, layers, flags, pace=pace)

    run = settled(runs, again, start, 50, expected, TOLERANCE)
    summary = run.summary
    assert summary["bubble_theory"] == pytest.approx(expected, abs=1e-9), "the script's own theory"
    assert summary["bubble_at_costs"] == pytest.approx(expected, abs=0.01), "its order, replayed"
    assert abs(summary["bubble_busiest"] - expected) <= TOLERANCE, (summary["bubble_per_rank"], expected)
    assert summary["paced_overruns"] == 0
    # pacing only sleeps: the arithmetic is the baseline's
    assert_close(run.grads, runs("00_baseline.py", 0, *size(layers)).grads, EXACT, "paced gradients")


@pytest.mark.parametrize("pace", ["50", "100"])
def test_waiting_where_it_need_not_misses_the_theory(runs, tmp_path, pace):
    """A W run after the pair where ZB-H1 runs it before: it misses at 50 ms and at twice that (what settled's
    launches at a longer pace rely on)."""
    slow = variant(tmp_path, "05_zero_bubble.py", prepend=program("w_after_the_pair"))
    run = paced(runs, "05_zero_bubble.py", 4, 8, 1, 7, (), path=slow, pace=("--pace", pace))
    assert run.summary["bubble_busiest"] - theory("05_zero_bubble.py", 4, 8, 1, 7) > TOLERANCE


def test_sends_before_receive_counted_by_hand(runs):
    """03 on 2 ranks with 2 micro-batches, paced, each step: rank 0 sends F0 at the end of slot 0 to rank 1,
    which has waited for it since the step began; F1 at the end of slot 1, while rank 1 runs F0, whose
    receive of F1 is posted with its send of B0 at the end of slot 2: early. Rank 1 sends B0 at the end of
    slot 2 and B1 at the end of slot 4, each after rank 0 posted its receive (at the end of slot 1 with
    F1's send, and of slot 3, B0). So 1 early send a step on rank 0, none on rank 1: 2 in the 2 measured steps."""
    run = pipelined(runs, "03_1f1b.py", 2, 2, *PACE)
    assert run.summary["sends_before_receive"] == [2, 0]
