"""schedules.py: its tables are PyTorch's orders and run, for every small layout, and come back from their CSV.

PyTorch's orders are read without processes: a multi-stage schedule computes every rank's actions when it is built
(pipeline_order), from stand-in stages that carry only their place; GPipe and 1F1B are run (_step_microbatches) on a
stand-in stage that has no peers and notes what it is asked to compute.
"""

from collections import Counter
from types import SimpleNamespace

import pytest
import torch.distributed.pipelining.schedules as torch_schedules

from schedules import (
    SCHEDULES,
    dualpipev,
    from_csv,
    gpipe,
    interleaved_1f1b,
    interleaved_zero_bubble,
    looped_bfs,
    one_f_one_b,
    table,
    takes_virtual_stages,
    zb_h1,
    zbv,
)
from tests.launch import KINDS, torch_csv, torch_order
from theory import replay, stage
from tools.plan import to_csv


class RecordingStage(SimpleNamespace):
    """Stands in for a single-stage schedule's PipelineStage: no peers, no model, no loss; notes what it computes."""

    def get_fwd_recv_ops(self, micro_batch):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, micro_batch, *args, **kwargs):
        self.computed.append(("forward", 0, micro_batch))

    def backward_one_chunk(self, micro_batch, **kwargs):
        self.computed.append(("full_backward", 0, micro_batch))

    def perform_reduce_grad(self, *args):
        pass


def torch_run(schedule_class, num_ranks, num_microbatches):
    """Every rank's computations as PyTorch's single-stage schedule_class runs them."""
    orders = []
    for rank in range(num_ranks):
        stage = RecordingStage(stage_index=rank, num_stages=num_ranks, is_last=False, computed=[])
        schedule = schedule_class(stage, num_microbatches)
        schedule._initialize_stage = lambda *args, **kwargs: None  # no shapes to learn from peers: nothing is sent
        schedule._step_microbatches()
        orders.append(stage.computed)
    return orders


def pytorch_rounds_fit(num_ranks, num_microbatches):
    """PyTorch's interleaved schedules take m micro-batches in max(1, m // n) equal rounds."""
    return num_microbatches % max(1, num_microbatches // num_ranks) == 0


@pytest.mark.parametrize("num_ranks", [1, 2, 3, 4])
def test_multi_stage_schedules_equal_pytorch(num_ranks):
    n = num_ranks
    compared = Counter()
    for m in range(1, 3 * n + 4):
        assert zbv(n, m) == torch_order(torch_schedules.ScheduleZBVZeroBubble, n, m, 2, "v"), (n, m)
        if m >= 2 * n and n > 1:  # what ScheduleDualPipeV takes (on one rank it would overlap nothing: we refuse it)
            assert dualpipev(n, m) == torch_order(torch_schedules.ScheduleDualPipeV, n, m, 2, "v"), (n, m)
            compared["dualpipev"] += 1
        if pytorch_rounds_fit(n, m):  # with one stage per rank, PyTorch's interleaved zero bubble is ZB-H1
            assert zb_h1(n, m) == torch_order(torch_schedules.ScheduleInterleavedZeroBubble, n, m, 1, "loop"), (n, m)
            compared["zb-h1"] += 1
        for v in (2, 3):
            assert looped_bfs(n, m, v) == torch_order(torch_schedules.ScheduleLoopedBFS, n, m, v, "loop"), (n, m, v)
            if pytorch_rounds_fit(n, m):
                pytorch = torch_order(torch_schedules.ScheduleInterleavedZeroBubble, n, m, v, "loop")
                assert interleaved_zero_bubble(n, m, v) == pytorch, (n, m, v)
                compared["interleaved-zero-bubble"] += 1
            # ours is 04's: Megatron-LM's groups of n, holes past m. PyTorch's groups are its rounds of
            # m // max(1, m // n) micro-batches, and its warm-up counts in them: the same order where n divides m.
            if m % n == 0:
                pytorch = torch_order(torch_schedules.ScheduleInterleaved1F1B, n, m, v, "loop")
                assert interleaved_1f1b(n, m, v) == pytorch, (n, m, v)
                compared["interleaved-1f1b"] += 1
    assert len(compared) == 3 + (n > 1) and min(compared.values()) >= 3, compared


@pytest.mark.parametrize("num_ranks", [1, 2, 3, 4])
def test_single_stage_schedules_equal_pytorch(num_ranks):
    for m in range(num_ranks, 3 * num_ranks + 4):  # Schedule1F1B takes m >= n
        # Run, not Schedule1F1B._get_pipeline_order: in PyTorch 2.13 that one numbers the last rank's forwards from 1.
        assert one_f_one_b(num_ranks, m) == torch_run(torch_schedules.Schedule1F1B, num_ranks, m), m
    for m in range(1, 3 * num_ranks + 4):
        # ScheduleGPipe runs the backwards first micro-batch first; 02 (and so ours) last first, popping its stash.
        forwards = [("forward", 0, i) for i in range(m)]
        pytorch = [forwards + [("full_backward", 0, i) for i in range(m)]] * num_ranks
        assert torch_run(torch_schedules.ScheduleGPipe, num_ranks, m) == pytorch
        assert gpipe(num_ranks, m) == [forwards + [("full_backward", 0, i) for i in reversed(range(m))]] * num_ranks


def check_runs(name, num_ranks, num_microbatches, num_chunks):
    """Every (stage, micro-batch) gets one forward, one I or B, and a W after an I, and the ranks can run their
    lists: a forward after the previous stage's, an I or B after the next stage's (the last stage's after its
    forward), a W after its I. Ranks run whatever is ready until none can; then every list must be done."""
    n, m = num_ranks, num_microbatches
    placement = SCHEDULES[name][1]
    orders = table(name, n, m, num_chunks)
    chunks = num_chunks if takes_virtual_stages(name) else 2 if placement == "v" else 1
    num_stages = n * chunks
    assert len(orders) == n
    placed = [[(kind, stage(placement, n, rank, chunk), i) for kind, chunk, i in order]
              for rank, order in enumerate(orders)]
    kinds = [*KINDS.values(), "overlapped_backward"]
    assert all(kind in kinds and 0 <= chunk < chunks and 0 <= i < m
               for order in orders for kind, chunk, i in order), (name, n, m, num_chunks)
    for order in orders:  # an overlapped backward is one step with the forward right before it
        assert all(k > 0 and order[k - 1][0] == "forward" for k, entry in enumerate(order)
                   if entry[0] == "overlapped_backward"), (name, n, m)
    counts = Counter((kind, index, i) for order in placed for kind, index, i in order)
    for index in range(num_stages):
        for i in range(m):
            forwards, split, weights, full, overlapped = (counts[kind, index, i] for kind in kinds)
            assert (forwards, split + full + overlapped, weights) == (1, 1, split), (name, n, m, num_chunks, index, i)
    assert sum(counts.values()) == sum(len(order) for order in orders)

    starts = replay(orders, lambda rank, chunk: stage(placement, n, rank, chunk), num_stages)
    stuck = [(rank, entry) for rank, order in enumerate(orders) for entry in order
             if (entry[0], stage(placement, n, rank, entry[1]), entry[2]) not in starts]
    assert not stuck, f"{name}, n = {n}, m = {m}, v = {num_chunks}: deadlock, first waiting {stuck[:n]}"


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_small_table_runs(name):
    for n in range(2 if name == "dualpipev" else 1, 6):
        for m in range(1, 2 * n + 3):
            for v in (1, 2, 3) if takes_virtual_stages(name) else (2,):
                check_runs(name, n, m, v)


def test_names_and_layouts_it_cannot_take_are_sentences():
    with pytest.raises(ValueError, match=r"no schedule named 'pipedream'.*pass one of gpipe, 1f1b, .*\.$"):
        table("pipedream", 4, 8)
    with pytest.raises(ValueError, match=r"no schedule named"):
        takes_virtual_stages("zero-bubble")
    for call, flag in [(lambda: one_f_one_b(0, 4), "num_ranks"), (lambda: dualpipev(2, 0), "num_microbatches"),
                       (lambda: interleaved_1f1b(2, 4, 0), "num_chunks"), (lambda: zb_h1(2, 2.5), "num_microbatches"),
                       (lambda: table("looped-bfs", 2, 4, num_chunks=-1), "num_chunks")]:
        with pytest.raises(ValueError, match=rf"^{flag} is .*: pass a whole number, {flag} >= 1\.$"):
            call()


def test_registry():
    assert [name for name in SCHEDULES if takes_virtual_stages(name)] == [
        "interleaved-1f1b", "looped-bfs", "interleaved-zero-bubble"]
    assert {name for name, (_, placement) in SCHEDULES.items() if placement == "v"} == {"zbv", "dualpipev"}
    assert table("1f1b", 3, 5, num_chunks=7) == one_f_one_b(3, 5)  # the chunk count goes only where it is taken


# PyTorch's multi-stage schedules: (class, its chunks a rank, placement, whether it takes this n and m)
MULTI_STAGE = [(torch_schedules.ScheduleZBVZeroBubble, 2, "v", lambda n, m: True),
               (torch_schedules.ScheduleDualPipeV, 2, "v", lambda n, m: n > 1 and m >= 2 * n),
               (torch_schedules.ScheduleInterleavedZeroBubble, 2, "loop", pytorch_rounds_fit),
               (torch_schedules.ScheduleInterleaved1F1B, 3, "loop", lambda n, m: m % n == 0),
               (torch_schedules.ScheduleLoopedBFS, 3, "loop", lambda n, m: True)]


@pytest.mark.parametrize("schedule_class,num_chunks,placement,takes", MULTI_STAGE,
                         ids=[entry[0].__name__ for entry in MULTI_STAGE])
def test_pytorchs_own_csv_reads_back_as_its_order(tmp_path, schedule_class, num_chunks, placement, takes):
    """from_csv of the file PyTorch's _dump_csv(format="compute_only") writes: PyTorch's own order (read from its
    pipeline_order), placed where PyTorch placed it (on one rank the loop and the V are one placement)."""
    read = 0
    for n in range(1, 5):
        for m in range(1, 3 * n + 3):
            if takes(n, m):
                found = from_csv(torch_csv(tmp_path / "dump.csv", schedule_class, n, m, num_chunks, placement), m)
                assert found.tables == torch_order(schedule_class, n, m, num_chunks, placement), (n, m)
                assert (found.placement, found.num_chunks) == ("loop" if n == 1 else placement, num_chunks), (n, m)
                read += 1
    assert read >= 10


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_table_comes_back_from_its_csv(name):
    """to_csv (tools/plan.py), then from_csv: the same table and placement, an overlapped step one cell."""
    placement = SCHEDULES[name][1]
    for n in range(2 if name == "dualpipev" else 1, 5):
        for m in range(1, 2 * n + 3):
            for v in (1, 2, 3) if takes_virtual_stages(name) else (2 if placement == "v" else 1,):
                tables = table(name, n, m, v)
                text = to_csv(tables, placement)
                assert text.count("OVERLAP_F_B") == sum(kind == "overlapped_backward" for order in tables
                                                        for kind, _, _ in order)
                assert from_csv(text, m) == ("loop" if n == 1 else placement, v, tables), (n, m, v)


@pytest.mark.parametrize("text, micro_batches, sentence", [
    ("0F0,0Z0\n1F0,1B0\n", 1, r"^rank 0's cell '0Z0' is no compute action: .*\.$"),
    ("0F0,(0B0;0F1)OVERLAP_F_B\n", 2, r"cell '\(0B0;0F1\)OVERLAP_F_B' is no compute action"),
    ("0F0,0B0\n2F0,2B0\n", 1, r"^its rows hold stages \[\[0\], \[2\]\]: 09 runs .* the loop .* the V .*\.$"),
    ("1F0,1B0\n0F0,0B0\n", 1, r"^its rows hold stages \[\[1\], \[0\]\]"),
    ("0F0,0B0\n1F0,1B0\n", 2, r"^it runs micro-batches 0 to 0: pass --micro-batches 1\.$"),
    ("0F0,0B0,0F1,0B1\n1F0,1B0,1F1,1B1\n", 1, r"^it runs micro-batches 0 to 1: pass --micro-batches 2\.$"),
    ("0F0,0B0,0F1\n1F0,1B0,1F1,1B1\n", 2, r"^stage 0 runs micro-batch 1's F, I or B, and W 1, 0 and 0 times: .*\.$"),
    ("0F0,0I0,0B0\n1F0,1B0\n", 1, r"^stage 0 runs micro-batch 0's F, I or B, and W 1, 2 and 0 times"),
    ("0F0,0I0\n1F0,1B0\n", 1, r"^stage 0 runs micro-batch 0's F, I or B, and W 1, 1 and 0 times"),
    ("0F0,0B0,0W0\n1F0,1B0\n", 1, r"^stage 0 runs micro-batch 0's F, I or B, and W 1, 1 and 1 times"),
    ("0B0,0F0\n1F0,1B0\n", 1, r"^rank 0 waits forever at 0B0's step: its input is made after it\.$"),
    ("0F0,(3F0;3B0)OVERLAP_F_B,0B0\n1F0,2F0,2B0,1B0\n", 1, r"^rank 0 waits forever at 3F0's step"),  # B needs its F
    ("", 1, r"^it has no rows, or an empty one: .*\.$"),
    ("0F0,0B0\n\n1F0,1B0\n", 1, r"^it has no rows, or an empty one"),
    (",,\n", 1, r"^it has no rows, or an empty one"),
])
def test_a_malformed_csv_is_one_sentence(text, micro_batches, sentence):
    with pytest.raises(ValueError, match=sentence):
        from_csv(text, micro_batches)
