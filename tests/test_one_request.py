"""NCCL answers a group of sends and receives (dist.batch_isend_irecv) with one request for the whole group, gloo
with one per operation. Every pipelined script, with the transport made to answer as NCCL does, gives the
baseline's gradients in float64: with gloo's rules, under --sync-sends, which answers so itself, and with the
harness's layer around torch's calls not installed, the lesson facing the backend's answer alone. The lesson
waits for the request that covers each operation, its own or the group's (common.covering), and the layer pairs each
message with the same: with the rule undone, one request per operation assumed again, the lesson's gradients are not
the baseline's, and the layer stops the run."""

import pytest

import schedules
from tests.launch import SIZE, SYNC, assert_matches, case_ids, launch, program, variant

# (script, world size, flags): every pipelined script, and 09 with each of its tables, at 3 ranks where it can
# (a rank between two others sends and receives in one group both ways); 7 layers, 10 samples that 3 or 4
# micro-batches do not divide.
CASES = [
    ("01_naive.py", 3, ()), ("02_gpipe.py", 3, ("--micro-batches", "4")), ("03_1f1b.py", 3, ("--micro-batches", "4")),
    ("03_1f1b.py", 2, ("--micro-batches", "3")), ("04_interleaved_1f1b.py", 2, ("--micro-batches", "4")),
    ("05_zero_bubble.py", 3, ("--micro-batches", "4")), ("06_zbv.py", 3, ("--micro-batches", "4")),
    ("07_pp_dp.py", 4, ("--data-parallel", "2", "--micro-batches", "3")),
    ("08_3d.py", 4, ("--data-parallel", "1", "--tensor-parallel", "2", "--micro-batches", "3")),
] + [("09_any_schedule.py", 3, ("--schedule", name, "--micro-batches", "4")) for name in schedules.SCHEDULES]
CASES = [(script, world, flags + sync) for script, world, flags in CASES for sync in ((), SYNC)]


NO_LAYER = "from harness import guarantees\nguarantees.install = lambda *args: None\n"  # torch's calls as they are


def one_request_a_group(tmp_path, script, world, flags, prepend=""):
    """The script run with the transport answering one request a group (tests/programs/one_request_a_group.py);
    under --sync-sends it answers so itself."""
    answer = "" if SYNC[0] in flags else program("one_request_a_group")
    return launch(tmp_path, variant(tmp_path, script, answer + prepend), world, *SIZE, *flags)


@pytest.mark.parametrize("script,world,flags", CASES, ids=case_ids(CASES, "", "n"))
def test_matches_baseline(tmp_path, baseline, script, world, flags):
    assert_matches(one_request_a_group(tmp_path, script, world, flags), baseline)


LESSON = [case for case in CASES if SYNC[0] not in case[2]]  # --sync-sends is the layer's


@pytest.mark.parametrize("script,world,flags", LESSON, ids=case_ids(LESSON, "", "n"))
def test_the_lesson_alone_matches_baseline(tmp_path, baseline, script, world, flags):
    assert_matches(one_request_a_group(tmp_path, script, world, flags, prepend=NO_LAYER), baseline)


@pytest.mark.parametrize("script,flags", [("03_1f1b.py", ("--micro-batches", "3")),
                                          ("06_zbv.py", ("--micro-batches", "4"))], ids=["03", "06"])
def test_the_lesson_assuming_one_request_per_operation_again(tmp_path, baseline, script, flags):
    """common.covering undone: the group's one request taken for its first operation's, the others' taken as done,
    so a receive after the group's first is handed over before it arrives."""
    undone = NO_LAYER + program("one_request_per_operation")
    run = one_request_a_group(tmp_path, script, 2, flags, prepend=undone)
    with pytest.raises(AssertionError):
        assert_matches(run, baseline)


@pytest.mark.parametrize("flags", [("--micro-batches", "3"), ("--micro-batches", "3", *SYNC)], ids=["gloo", "sync"])
def test_the_layer_assuming_one_request_per_message_again(tmp_path, flags):
    """common.covering undone (each message zipped with a request of its own, as gloo answers): the layer finds a
    group's messages and requests do not pair, and the run stops rather than hand over an unfilled buffer."""
    undone = "import common\ncommon.covering = lambda requests, count: requests\n"
    with pytest.raises(AssertionError, match="exited"):
        one_request_a_group(tmp_path, "03_1f1b.py", 2, flags, prepend=undone)
