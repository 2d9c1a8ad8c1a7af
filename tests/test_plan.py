"""tools/plan.py, tools/costs.py and tools/search.py: the plan's rows and bad input, the search's tables (valid,
within memory, never deadlocked) and its bubble against every table of its placement that fits the same memory; the
table plan.py saves is the search's, and schedules.from_csv reads it back."""

import json
import time
from collections import Counter
from types import SimpleNamespace

import pytest

import schedules
import theory
from tests.launch import python
from tools import costs, held, paper, search
from tools.plan import Row, counted, default_memory, partitioned, to_csv
from tools.plan import plan as plan_rows

KINDS = ("forward", "backward", "weight")


def plan(*flags):
    """tools/plan.py run from the repository's root, as a user runs it (forked: tests.launch.python)."""
    return python("tools/plan.py", *flags)


def rows(*flags):
    """plan.py --json's objects, by schedule."""
    result = plan(*flags, "--json")
    assert result.returncode == 0, result.stderr
    return {row["schedule"]: row for row in map(json.loads, result.stdout.splitlines())}


def simulated(tables, placement, cost, message=0.0, num_chunks=None):
    return costs.simulate(tables, placement, num_chunks or (1 if placement == "loop" else 2), cost, message)


PLACEMENTS = [("loop", 1), ("loop", 2), ("loop", 3), ("v", 2)]  # (placement, chunks a rank)


def rivals(placement, num_chunks, num_ranks, num_microbatches, cost, message=0.0):
    """Every schedules.py table of the placement at these chunks a rank that runs: name -> its simulation."""
    found = {}
    for name, (_, its_placement) in schedules.SCHEDULES.items():
        if its_placement != placement or (not schedules.takes_virtual_stages(name) and num_chunks != 1 + (
                placement == "v")):
            continue
        try:
            tables = schedules.table(name, num_ranks, num_microbatches, num_chunks)
            found[name] = simulated(tables, placement, cost, message, num_chunks)
        except ValueError:  # a layout the rule does not take, or an order that cannot run
            continue
    return found


def test_every_schedule_at_64_stages_and_256_micro_batches_in_under_10_seconds():
    """plan.py's planning (tools.plan.plan: every table and the search, replayed) at 64 stages and 256 micro-batches,
    timed in this process: a launch's own start, Python's and torch's import (about 3 s on these shared cores),
    is not the planner's."""
    start = time.perf_counter()
    found = plan_rows(64, 256, 2, costs.stage_costs(), 0.0, 64)
    elapsed = time.perf_counter() - start
    assert {row.schedule for row in found} == {*schedules.SCHEDULES, "search"}
    assert all(row.simulation for row in found if row.schedule == "search")
    assert elapsed < 10, f"{elapsed:.1f} s"


def test_every_schedule_balanced_at_64_stages_256_micro_batches_and_512_blocks_in_under_20_seconds():
    """tools/plan.py --layers 512 --hidden 1024 --classes 16384 at 64 stages and 256 micro-batches: each schedule's
    rows at the even and the balanced split (plan.partitioned) in under 20 s, table and replays included. (The
    search's own time is the test above's.)"""
    model = SimpleNamespace(layers=512, hidden=1024, classes=16384, partition="even", weight_memory=1, overlap=1.0)
    for name, (_, placement) in schedules.SCHEDULES.items():
        chunks = 2 if schedules.takes_virtual_stages(name) or placement == "v" else 1
        start = time.perf_counter()
        row = Row(name, placement, chunks, schedules.table(name, 64, 256, chunks))
        even, balanced = partitioned(row, model, counted(model))  # at plan.py's counted costs for it
        elapsed = time.perf_counter() - start
        assert even.partition == [8 // chunks] * 64 * chunks, name
        assert balanced.simulation.step < even.simulation.step and sum(balanced.partition) == 512, name
        assert elapsed < 20, f"{name}: {elapsed:.1f} s"


@pytest.mark.parametrize("n,m", [(2, 4), (4, 8), (4, 12), (6, 12)])
def test_bubble_window_is_the_papers_rate(n, m):
    """bubble_window, the zero-bubble paper's rate, against bubble: in 1F1B rank 0's window is the whole step, so
    the two agree; ZB-V fills each rank's window from its first F to its last W once m >= 2n (the paper's "zero
    bubble"), while its bubble over the pipeline's span is (n - 1) / (6m + n - 1)."""
    one_f_one_b = simulated(schedules.one_f_one_b(n, m), "loop", theory.UNIT_COSTS)
    assert one_f_one_b.bubble_window == pytest.approx(one_f_one_b.bubble)
    zbv = costs.simulate(schedules.zbv(n, m), "v", 2)
    assert zbv.bubble_window == pytest.approx(0, abs=1e-12) and zbv.bubble == pytest.approx(theory.zbv_bubble(n, m))


def test_json_rows_name_every_schedule_and_carry_its_numbers():
    """Every row's fields; 1F1B's peaks at this MLP's share (the default --weight-memory, 16 layers over 4 stages),
    a moment in each full backward at what its I adds (09 runs it as its I, then its W)."""
    found = rows("--stages", "4", "--micro-batches", "8", "--costs", "1,2,1,0.5", "--memory", "4")
    assert set(found) == {*schedules.SCHEDULES, "search"}  # the names --schedule takes, and the search's
    share = held.weight_share(16 / 4)
    for row in found.values():
        assert row.keys() >= {"schedule", "step", "bubble", "bubble_window", "peak_inflight", "weight_memory",
                              "messages"}
        assert len(row["peak_inflight"]) == len(row["messages"]) == 4
        assert row["weight_memory"] == share
    assert found["1f1b"]["peak_inflight"] == pytest.approx([4 + share - 1, 3 + share - 1, 2 + share - 1, share])
    assert found["1f1b"]["messages"] == [8, 16, 16, 8]  # m forwards out of rank 0; m each way in the middle
    assert found["gpipe"]["over_memory"] and not found["search"]["over_memory"]


def test_simulate_agrees_with_the_closed_forms():
    n, m = 4, 8
    one_f_one_b = simulated(schedules.one_f_one_b(n, m), "loop", theory.UNIT_COSTS)
    assert one_f_one_b.bubble == pytest.approx(theory.gpipe_bubble(n, m))
    assert one_f_one_b.step == 3 * (m + n - 1)
    zbv = simulated(schedules.zbv(n, m), "v", theory.UNIT_COSTS)  # a chunk of the V: half a stage's time and memory
    assert zbv.bubble == pytest.approx(theory.zbv_bubble(n, m))
    assert zbv.peak_inflight == [theory.zbv_inflight(n, m, rank) / 2 for rank in range(n)]


COSTS = [(1, 1, 1), (1, 2, 1), (1, 3, 1), (1, 2, 0.5), (2, 3, 1), (1, 1, 2)]  # F, I, W


@pytest.mark.parametrize("num_ranks, num_microbatches", [(4, 8), (6, 24), (3, 5), (2, 4), (5, 17), (1, 3)])
@pytest.mark.parametrize("message", [0, 0.3])
@pytest.mark.parametrize("placement, num_chunks", PLACEMENTS)
def test_the_search_is_no_worse_than_any_table_that_fits_its_memory(num_ranks, num_microbatches, message,
                                                                    placement, num_chunks):
    """At each table's own peak memory, the search's step (so its bubble) is no longer, and it stays within."""
    for forward, input_grad, weight in COSTS:
        cost = costs.stage_costs(forward, input_grad, weight)
        for name, rival in rivals(placement, num_chunks, num_ranks, num_microbatches, cost, message).items():
            memory = max(rival.peak_inflight)
            tables = search.search(num_ranks, num_microbatches, placement, cost, memory, message, num_chunks)
            found = simulated(tables, placement, cost, message, num_chunks)
            assert max(found.peak_inflight) <= memory
            assert found.step <= rival.step + 1e-9, f"{name} at memory {memory}, costs {forward, input_grad, weight}"


@pytest.mark.parametrize("num_ranks, num_microbatches", [(4, 8), (3, 5), (2, 7), (5, 10), (1, 3)])
@pytest.mark.parametrize("message", [0, 0.3])
def test_no_table_nor_search_beats_the_least_step(num_ranks, num_microbatches, message):
    """costs.least_step bounds every order from below, on every placement, at the memory the order holds."""
    n, m = num_ranks, num_microbatches
    for forward, input_grad, weight in COSTS:
        cost = costs.stage_costs(forward, input_grad, weight)
        for placement, chunks in PLACEMENTS:
            found = list(rivals(placement, chunks, n, m, cost, message).values())
            tables = search.search(n, m, placement, cost, n, message, chunks)
            found.append(simulated(tables, placement, cost, message, chunks))
            for simulation in found:
                limit = round(max(simulation.peak_inflight) * chunks)  # (chunk, micro_batch) pairs
                least = costs.least_step(placement, n, chunks, m, cost, message, limit)
                assert simulation.step >= least - 1e-9, (placement, chunks, forward, input_grad, weight)


def test_zb_h1_reaches_the_least_step_at_equal_costs():
    """F = I = W, m >= n: ZB-H1's step is the least any order on the loop can take, at any memory: 3m + n - 1."""
    for n in range(1, 7):
        for m in range(n, 3 * n + 2):
            step = simulated(schedules.zb_h1(n, m), "loop", theory.UNIT_COSTS).step
            for memory in (n, 2 * n, m):
                assert step == costs.least_step("loop", n, 1, m, theory.UNIT_COSTS, 0.0, memory) == 3 * m + n - 1


def test_the_least_step_is_reached_where_memory_binds():
    """I = 2F = 2W on the loop: at 1F1B's memory (n) rank 0 idles until its first I, less the n F's it can run
    meanwhile, and both ZB-H1 and the search take exactly the least step; at 2n the search takes the smaller one."""
    cost = costs.stage_costs(1, 2, 1)
    for n in range(2, 8):
        for m in (2 * n, 4 * n):
            least = {memory: costs.least_step("loop", n, 1, m, cost, 0.0, memory) for memory in (n, 2 * n)}
            assert least[n] == 4 * m + 2 * n - 2 and least[2 * n] == 4 * m + n - 1
            assert simulated(schedules.zb_h1(n, m), "loop", cost).step == least[n]
            for memory in (n, 2 * n):
                assert simulated(search.search(n, m, "loop", cost, memory), "loop", cost).step == least[memory]


@pytest.mark.parametrize("flags", [
    ("--stages", "8", "--micro-batches", "32", "--costs", "1,2,1", "--virtual-stages", "4"),
    ("--stages", "4", "--micro-batches", "8", "--costs", "1,2,1,0.3", "--virtual-stages", "3", "--memory", "5"),
    ("--stages", "3", "--micro-batches", "12", "--costs", "1,1,2,0.3", "--memory", "3"),
    ("--stages", "5", "--micro-batches", "9", "--costs", "2,3,1", "--memory", "7")])
def test_plans_search_row_is_no_slower_than_any_row_within_memory(flags):
    """Within --memory, or without it 1F1B's (n, and what an I adds at this MLP's share), the search's row is within
    and no slower than any row that is."""
    found = rows(*flags)
    share = found["search"]["weight_memory"]
    memory = float(flags[flags.index("--memory") + 1]) if "--memory" in flags else default_memory(int(flags[1]), share)
    assert max(found["search"]["peak_inflight"]) <= memory + 1e-9
    for name, row in found.items():
        if "step" in row and max(row["peak_inflight"]) <= memory + 1e-9:
            assert found["search"]["step"] <= row["step"] + 1e-9, name


def own_bubbles(found, tables, placement, cost):
    """Each rank's idle share of its own span, from its first start to its last end."""
    shares = []
    for rank, table in enumerate(tables):
        spans = [found.spans[kind, theory.stage(placement, len(tables), rank, chunk), micro_batch]
                 for kind, chunk, micro_batch in table]
        busy = sum(cost[kind] for kind, _, _ in table)
        shares.append(1 - busy / (max(end for _, end in spans) - min(start for start, _ in spans)))
    return shares


@pytest.mark.parametrize("num_ranks, num_microbatches", [(4, 8), (8, 32), (3, 12)])
def test_at_twice_the_memory_the_search_leaves_no_bubble_inside_a_rank(num_ranks, num_microbatches):
    """Equal F, I and W, memory 2n on the loop (ZB-H2's). Over the pipeline's span ZB-H1 is already the least any
    order can reach, (n - 1) / (3m + n - 1): the last rank starts n - 1 units late and computes 3m. So is the
    search's. Within each rank's own span, as the zero-bubble paper counts ZB-H2's, the search leaves none, where
    ZB-H1 leaves rank 0 its n - 1 units: at most half of ZB-H1's bubble either way."""
    n, m = num_ranks, num_microbatches
    tables = search.search(n, m, "loop", theory.UNIT_COSTS, 2 * n)
    found = simulated(tables, "loop", theory.UNIT_COSTS)
    zb_h1 = simulated(schedules.zb_h1(n, m), "loop", theory.UNIT_COSTS)
    assert max(found.peak_inflight) <= 2 * n
    assert found.step == zb_h1.step == costs.least_step("loop", n, 1, m, theory.UNIT_COSTS, 0.0, 2 * n)
    assert found.bubble == pytest.approx((n - 1) / (3 * m + n - 1))
    assert max(own_bubbles(found, tables, "loop", theory.UNIT_COSTS)) <= zb_h1.bubble / 2


@pytest.mark.parametrize("placement, num_chunks", PLACEMENTS)
@pytest.mark.parametrize("forward, input_grad, weight, message", [(1, 1, 1, 0), (1, 2, 1, 0), (2, 1, 3, 0.5)])
def test_search_tables_are_valid_for_any_layout_and_memory(placement, num_chunks, forward, input_grad, weight,
                                                           message):
    """Each (chunk, micro_batch) of each rank: one F, one I, one W; within memory; and the replay runs them all."""
    cost = costs.stage_costs(forward, input_grad, weight)
    for n in range(1, 7):
        for m in (1, 2, 3, 5, 8, 13):
            for memory in sorted({1, 1.5, 2, n, 2 * n, m + 1}):
                tables = search.search(n, m, placement, cost, memory, message, num_chunks)
                every = Counter((kind, chunk, i) for kind in KINDS for chunk in range(num_chunks) for i in range(m))
                assert all(Counter(table) == every for table in tables), (n, m, memory)
                found = simulated(tables, placement, cost, message, num_chunks)  # raises if it deadlocks
                assert max(found.peak_inflight) <= memory, (n, m, memory)


@pytest.mark.parametrize("arguments, sentence", [
    ((4, 8, "loop", 0.5, 1), "memory is 0.5"), ((4, 8, "v", 0.9, 2), "memory is 0.9"),
    ((4, 8, "ring", 2, 1), "placement"), ((0, 8, "loop", 2, 1), "num_ranks"),
    ((4, 0, "loop", 2, 1), "num_microbatches"), ((4, 8, "loop", 2, 0), "num_chunks"),
    ((4, 8, "v", 2, 3), "the V holds 2 chunks")])
def test_search_refuses_what_no_schedule_can_do(arguments, sentence):
    num_ranks, num_microbatches, placement, memory, num_chunks = arguments
    with pytest.raises(ValueError, match=sentence):
        search.search(num_ranks, num_microbatches, placement, theory.UNIT_COSTS, memory, num_chunks=num_chunks)


def write_trace(path, events):
    with open(path, "w") as file:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, file)


def span(kind, duration, chunk):
    return {"name": f"{kind} 0.{chunk}", "cat": kind, "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": duration,
            "args": {"step": 1, "micro_batch": 0, "chunk": chunk}}


def test_costs_from_a_trace_are_each_kinds_mean_span_of_a_stage(tmp_path):
    """A run with two chunks a rank: a chunk's mean span is half a stage's."""
    trace = tmp_path / "trace.json"
    write_trace(trace, [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}},
                        span("forward", 10, 0), span("forward", 20, 1), span("backward", 30, 0),
                        span("backward", 30, 1), span("weight", 5, 0), span("weight", 15, 1),
                        {"name": "wait", "cat": "wait", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 999}])
    assert rows("--stages", "4", "--micro-batches", "8", "--costs-from", str(trace)) == \
        rows("--stages", "4", "--micro-batches", "8", "--costs", "30,60,20")


@pytest.mark.parametrize("flags", [("--stages", "3", "--micro-batches", "4"),
                                   ("--stages", "4", "--micro-batches", "8", "--costs", "1,2,1", "--memory", "8"),
                                   ("--stages", "2", "--micro-batches", "5", "--virtual-stages", "3")])
def test_save_writes_the_search_table_and_svg_draws_it(tmp_path, flags):
    """--save: the search's table as PyTorch's compute_only CSV, which schedules.from_csv reads back as the search's
    own; --svg: a box per computation of it."""
    result = plan(*flags, "--save", str(tmp_path / "plan.csv"), "--svg", str(tmp_path / "plan.svg"))
    assert result.returncode == 0, result.stderr
    found = rows(*flags)["search"]
    n, m = int(flags[1]), int(flags[3])
    share = found["weight_memory"]  # this MLP's, and 1F1B's memory at it, unless given
    memory = float(flags[flags.index("--memory") + 1]) if "--memory" in flags else default_memory(n, share)
    looped = int(flags[flags.index("--virtual-stages") + 1]) if "--virtual-stages" in flags else 2
    cost, message = costs.parse_costs(flags[flags.index("--costs") + 1] if "--costs" in flags else "1,1,1")
    placement, chunks, tables = search.best_search(n, m, cost, memory, message, looped, weight_memory=share)
    saved = (tmp_path / "plan.csv").read_text()
    assert saved == to_csv(tables, placement)
    assert schedules.from_csv(saved, m) == (placement, chunks, tables) == (found["placement"], found["chunks"], tables)
    assert (tmp_path / "plan.svg").read_text().count("<rect") == 1 + sum(len(table) for table in tables)


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("more", [0, 1, 3, "n", "2n+1"])
def test_dualpipev_idles_deepseeks_formula(n, more):
    """DeepSeek-V3's Table 2: DualPipe's bubble is (PP/2 - 1)(F&B + B - 3W), F a forward chunk, B a full backward
    chunk, W its weight part, F&B a forward and a backward overlapped. DualPipeV (our dualpipev, PyTorch's
    ScheduleDualPipeV) is DualPipe on PP = 2n stages cut in half, onto n ranks. At F = I = W = 1 a chunk and no
    overlap (F&B = F + B = 3, B = 2) that is 2(n - 1): plan.py's window_idle of its dualpipev row, the most any rank
    idles within its own window (its first computation to its last), at every n and m = 2n and more."""
    m = 2 * n + {"n": n, "2n+1": 2 * n + 1}.get(more, more)
    found = {row.schedule: row for row in plan_rows(n, m, 2, costs.stage_costs(2, 2, 2), 0.0, n, ("v",))}
    pp = 2 * n
    assert found["dualpipev"].simulation.window_idle == pytest.approx((pp / 2 - 1) * (3 + 2 - 3 * 1))


def test_overlap_shortens_each_f_and_b_step_alone():
    """--overlap 0.8: each of DualPipeV's F&B steps lasts 0.8 of its forward and full backward (a chunk's F 0.5,
    I + W 1.5 at --costs 1,2,1), its rank computing that much less; a row without F&B steps is the same as at 1."""
    flags = ["--stages", "4", "--micro-batches", "8", "--costs", "1,2,1"]
    whole, overlapped = rows(*flags), rows(*flags, "--overlap", "0.8")
    assert overlapped["dualpipev"]["step"] < whole["dualpipev"]["step"]
    assert {name: row["step"] for name, row in overlapped.items() if name != "dualpipev"} == {
        name: row["step"] for name, row in whole.items() if name != "dualpipev"}
    tables, cost = schedules.dualpipev(4, 8), costs.stage_costs(1, 2, 1)
    simulation = costs.simulate(tables, "v", 2, cost, overlap=0.8)
    for rank, table in enumerate(tables):
        for (kind, chunk, i), (next_kind, next_chunk, j) in zip(table, table[1:]):
            if next_kind == "overlapped_backward":
                start, _ = simulation.spans[kind, theory.stage("v", 4, rank, chunk), i]
                _, end = simulation.spans[next_kind, theory.stage("v", 4, rank, next_chunk), j]
                assert end - start == pytest.approx(0.8 * (0.5 + 1.5))


@pytest.mark.parametrize("placement", ["loop", "v"])
def test_placement_keeps_the_plan_and_its_search_to_one(placement):
    """--placement loop|v: only that placement's schedules, and the search on it alone (at the costs where the
    other placement's search wins)."""
    found = rows("--stages", "4", "--micro-batches", "8", "--costs", "1,2,1", "--placement", placement)
    assert set(found) == {name for name, (_, where) in schedules.SCHEDULES.items() if where == placement} | {"search"}
    assert all(row["placement"] == placement for row in found.values())


@pytest.mark.parametrize("flags", [
    ["--memory", "0.5"], ["--costs", "1,x,1"], ["--costs", "1,2"], ["--costs", "1,0,1"], ["--costs", "1,1,1,-1"],
    ["--costs-from", "TRACE_WITHOUT_SPANS"], ["--costs-from", "NO_SUCH_FILE"], ["--costs-from", "NOT_JSON"],
    ["--stages", "0"], ["--stages", "four"], ["--placement", "ring"], ["--layers", "8", "--partition", "4,x"],
    ["--layers", "0"], ["--weight-memory", "0"], ["--weight-memory", "-1"], ["--overlap", "0"], ["--overlap", "1.5"],
    ["--overlap", "0.6"], ["--objective", "bubble"]])
def test_bad_input_is_one_sentence_and_a_failure(flags, tmp_path):
    write_trace(tmp_path / "empty.json", [{"name": "wait", "cat": "wait", "ph": "X", "ts": 0, "dur": 5}])
    (tmp_path / "garbage.json").write_text("{not json")
    paths = {"TRACE_WITHOUT_SPANS": tmp_path / "empty.json", "NO_SUCH_FILE": tmp_path / "missing.json",
             "NOT_JSON": tmp_path / "garbage.json"}
    flags = [str(paths.get(flag, flag)) for flag in flags]
    defaults = ["--stages", "4", "--micro-batches", "8"] if "--stages" not in flags else ["--micro-batches", "8"]
    result = plan(*defaults, *flags)
    assert result.returncode != 0
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr


PAPER = paper.ROWS  # the zero-bubble paper's settings and rates (tools/paper.py)


@pytest.mark.parametrize("row", PAPER, ids=[f"p{row[0]}-m{row[1]}-h{row[6]}" for row in PAPER])
def test_the_papers_1f1b_and_zb_h1_rates_are_the_replays_window(row):
    """1F1B's and ZB-H1's tables replayed at the paper's measured costs, T_comm a message: their bubble_window is
    the paper's rate to 4 decimals on every row (its ZB-H2's too, at its closed form (p - 1)(F + I + 2c - 2W))."""
    p, m, forward, input_grad, weight, message = row[:6]
    one_f_one_b, zb_h1, zb_h2 = row[8:11]
    cost = costs.stage_costs(forward, input_grad, weight)
    assert round(simulated(schedules.one_f_one_b(p, m), "loop", cost, message).bubble_window, 4) == one_f_one_b
    assert round(simulated(schedules.zb_h1(p, m), "loop", cost, message).bubble_window, 4) == zb_h1
    work = m * (forward + input_grad + weight)
    h2 = work + (p - 1) * (forward + input_grad + 2 * message - 2 * weight)
    assert round(1 - work / h2, 4) == zb_h2


@pytest.mark.parametrize("times", [1, 2], ids=["p", "2p"])
@pytest.mark.parametrize("row", PAPER, ids=[f"p{row[0]}-m{row[1]}-h{row[6]}" for row in PAPER])
def test_the_search_is_no_worse_than_the_papers_zb_1p_and_zb_2p(row, times):
    """The search on the loop at the paper's costs, memory p (2p) micro-batches of M_B and an I leaving its M_W / M_B
    for its W (the paper calls I 'B'), judged by the paper's measure (objective "window"): its rate is at most the
    paper's ZB-1p's (ZB-2p's) on every row, its peak within the memory, and it answers in under 60 s (at 32 stages
    and 256 micro-batches too)."""
    p, m, forward, input_grad, weight, message, h, a = row[:8]
    cost, share = costs.stage_costs(forward, input_grad, weight), paper.weight_memory(h, a)
    start = time.perf_counter()
    tables = search.search(p, m, "loop", cost, times * p, message, weight_memory=share, objective="window")
    assert time.perf_counter() - start < 60
    found = costs.simulate(tables, "loop", 1, cost, message, share)
    assert round(found.bubble_window, 4) <= (row.zb_1p, row.zb_2p)[times - 1]
    assert max(found.peak_inflight) <= times * p + 1e-9


def test_the_objective_orders_step_and_window():
    """plan.py --objective: judged by step the search's step is no longer, judged by window its window no wider,
    at the paper's first row (p 8, m 24, 2p), where the two differ."""
    p, m, forward, input_grad, weight, message, h, a = PAPER[0][:8]
    flags = ["--stages", str(p), "--micro-batches", str(m), "--costs", f"{forward},{input_grad},{weight},{message}",
             "--memory", str(2 * p), "--weight-memory", str(paper.weight_memory(h, a)), "--virtual-stages", "1",
             "--placement", "loop"]
    by_step, by_window = rows(*flags)["search"], rows(*flags, "--objective", "window")["search"]
    assert by_step["step"] < by_window["step"] and by_window["bubble_window"] < by_step["bubble_window"]
    assert round(by_window["bubble_window"], 4) <= PAPER[0][12] < round(by_step["bubble_window"], 4)


@pytest.mark.parametrize("n,m", [(2, 5), (4, 8), (5, 7)])
def test_weight_memory_above_one_adds_what_an_i_holds_for_its_w(n, m):
    """theory.peak_inflight at a share above 1 (this MLP's, tools/held.py's weight_share): an I adds what W needs to
    what its F held, so that a full backward, its I then its W as 09 runs it, counts as the two at once; 1F1B's
    ranks hold theirs and a moment of that more; and the search, within 1F1B's memory so counted, never slower, and
    with less than an I of one micro-batch needs, no order (every start, the paper's heuristic's too, over it)."""
    share = held.weight_share(3)
    for name, chunks in (("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("dualpipev", 2)):
        tables = schedules.table(name, n, m, chunks)
        at_once = [schedules.split(order, 0) for order in tables]
        assert theory.peak_inflight(tables, share) == pytest.approx(theory.peak_inflight(at_once, share)), name
    assert theory.peak_inflight(schedules.one_f_one_b(n, m), share) == pytest.approx(
        [min(n - rank, m) + share - 1 for rank in range(n)])
    cost = costs.stage_costs(1, 2, 1)
    for placement, num_chunks in PLACEMENTS:
        for name, rival in rivals(placement, num_chunks, n, m, cost, 0.3).items():
            rival_tables = schedules.table(name, n, m, num_chunks)
            memory = max(theory.peak_inflight(rival_tables, share)) / num_chunks
            tables = search.search(n, m, placement, cost, max(memory, 1), 0.3, num_chunks, weight_memory=share)
            found = simulated(tables, placement, cost, 0.3, num_chunks)
            assert max(theory.peak_inflight(tables, share)) <= max(memory, 1) * num_chunks + 1e-9, name
            assert found.step <= rival.step + 1e-9, (name, placement, num_chunks)
    for micro_batches in (1, m):  # one micro-batch in its I holds `share`
        with pytest.raises(ValueError, match="no order"):
            search.search(n, micro_batches, "loop", cost, 1, 0.3, 1, weight_memory=share)


def test_weight_memory_lets_an_i_free_what_its_w_does_not_need():
    """theory.peak_inflight with a share: ZB-H1 holds n on every rank at 1 (each micro-batch whole until its W), and
    at a smaller share n on rank 0 alone (n forwards before its first I), less on the others; a table without W's
    holds the same at any share; and the search within a memory that 1 cannot meet finds a table at the share, its
    peak within it, faster than at 1 in the same memory."""
    n, m = 4, 8
    assert theory.peak_inflight(schedules.zb_h1(n, m)) == [n] * n
    shared_peaks = theory.peak_inflight(schedules.zb_h1(n, m), 0.25)
    assert shared_peaks[0] == n and all(peak < n for peak in shared_peaks[1:]), shared_peaks
    assert theory.peak_inflight(schedules.one_f_one_b(n, m), 0.25) == theory.peak_inflight(schedules.one_f_one_b(n, m))
    p, m, forward, input_grad, weight, message, h, a = PAPER[0][:8]  # the search at the paper's first row's costs
    cost, share = costs.stage_costs(forward, input_grad, weight), paper.weight_memory(h, a)
    whole = costs.simulate(search.search(p, m, "loop", cost, 10, message), "loop", 1, cost, message)
    shared = costs.simulate(search.search(p, m, "loop", cost, 10, message, weight_memory=share), "loop", 1, cost,
                            message, share)
    assert max(whole.peak_inflight) <= 10 and max(shared.peak_inflight) <= 10
    assert shared.bubble < whole.bubble - 0.02  # what an I frees makes room for more forwards in flight (0.109, 0.141)
