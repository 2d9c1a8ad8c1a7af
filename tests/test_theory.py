"""The closed forms the README quotes are the counts over the scripts' tables: each bubble the table's replay at one
unit a span, each in-flight count its peak, for every small layout (plain Python, no processes)."""

import pytest

import schedules
from theory import (
    UNIT_SPANS,
    busiest_bubble,
    gpipe_bubble,
    interleaved_inflight,
    naive_bubble,
    one_f_one_b_inflight,
    peak_inflight,
    replay,
    stage,
    zb_h1_bubble,
    zb_h1_inflight,
    zbv_bubble,
    zbv_inflight,
)


def replayed(tables, placement, num_chunks):
    n = len(tables)
    return busiest_bubble(tables, lambda rank, chunk: stage(placement, n, rank, chunk), n * num_chunks, cost=UNIT_SPANS)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_closed_forms_are_the_tables_counts(n):
    for m in range(1, 3 * n + 3):
        assert naive_bubble(n) == pytest.approx(replayed(schedules.gpipe(n, 1), "loop", 1))
        for table in (schedules.gpipe(n, m), schedules.one_f_one_b(n, m)):
            assert gpipe_bubble(n, m) == pytest.approx(replayed(table, "loop", 1)), (n, m)
        assert zb_h1_bubble(n, m) == pytest.approx(replayed(schedules.zb_h1(n, m), "loop", 1)), (n, m)
        assert zbv_bubble(n, m) == pytest.approx(replayed(schedules.zbv(n, m), "v", 2)), (n, m)
        assert peak_inflight(schedules.one_f_one_b(n, m)) == [one_f_one_b_inflight(n, m, r) for r in range(n)]
        assert peak_inflight(schedules.zb_h1(n, m)) == [zb_h1_inflight(n, m)] * n, (n, m)
        assert peak_inflight(schedules.zbv(n, m)) == [zbv_inflight(n, m, r) for r in range(n)], (n, m)
        for v in (2, 3):
            assert peak_inflight(schedules.interleaved_1f1b(n, m, v)) == [
                interleaved_inflight(n, m, v, r) for r in range(n)], (n, m, v)


def test_a_full_backward_is_two_units():
    """09's theory: F, I and W one unit each, a full backward (B) two (1F1B: (n - 1) slots of three units)."""
    n, m = 4, 8
    tables = schedules.one_f_one_b(n, m)
    bubble = busiest_bubble(tables, lambda rank, chunk: stage("loop", n, rank, chunk), n)
    assert bubble == pytest.approx(3 * (n - 1) / (3 * m + 3 * (n - 1)))


def test_an_order_that_cannot_run_stops_the_replay():
    """A W before its own I, or a backward before the next stage's: the replay places nothing from there on,
    which is how tests/test_schedules.py finds a table that would deadlock."""
    one_rank = [[("forward", 0, 0), ("weight", 0, 0), ("backward", 0, 0)]]
    assert sorted(replay(one_rank, lambda rank, chunk: rank, 1)) == [("forward", 0, 0)]
    two_ranks = [[("forward", 0, 0), ("full_backward", 0, 0)], [("full_backward", 0, 0), ("forward", 0, 0)]]
    assert sorted(replay(two_ranks, lambda rank, chunk: rank, 2)) == [("forward", 0, 0)]
