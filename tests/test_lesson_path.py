"""What a learner's path through a script costs: the lines of the lesson's helpers that a run executes.

The lesson is the numbered script, common.py and the rules its helpers keep (guarantees.py), with the bodies of
schedules.py and theory.py that the script's own calls reach. What only measures, plans or paces is the harness's
and the tools' (harness/, tools/): their calls into the helpers are not the learner's path, and a lab feature adds
no line to it (tests/programs/lesson_lines.py counts, by tracing every rank)."""

import json

import pytest

from tests import launch
from tests.launch import start_ranks, variant, wait_ranks

LIMIT = 190  # the lines of common.py, guarantees.py, schedules.py and theory.py a run of 03 may execute


def lesson_lines(tmp_path, monkeypatch, script, nproc, *flags):
    """The (file, line) pairs of the lesson's helpers that any rank of `script` executed on the lesson's path."""
    monkeypatch.setitem(launch.ENV, "LESSON_LINES", str(tmp_path / "lines"))
    path = variant(tmp_path, script, launch.program("lesson_lines"))
    command = [launch.sys.executable, path, *flags]
    assert wait_ranks(start_ranks(command, nproc, tmp_path), 120) == [0] * nproc
    return {tuple(line) for rank in range(nproc) for line in json.loads((tmp_path / f"lines.rank{rank}").read_text())}


@pytest.mark.parametrize("nproc, flags", [(2, ()), (4, ("--micro-batches", "4")), (2, ("--pace", "1")),
                                          (2, ("--partition", "balanced", "--classes", "64"))],
                         ids=["n2", "n4", "paced", "balanced"])
def test_a_run_of_03_executes_at_most_190_lines_of_the_lessons_helpers(tmp_path, monkeypatch, nproc, flags):
    """The README's command at a small size, and with the lab's flags: pacing and planning add no line."""
    size = ("--layers", "8", "--hidden", "64", "--batch-size", "16", "--steps", "2", "--threads", "1")
    executed = lesson_lines(tmp_path, monkeypatch, "03_1f1b.py", nproc, *size, *flags)
    files = {name for name, _ in executed}
    assert {"common.py", "guarantees.py"} <= files, files  # the count reaches the helpers
    assert len(executed) <= LIMIT, f"{len(executed)} lines: {sorted(executed)}"


def test_the_count_sees_the_lab_put_back_on_the_lesson_path(tmp_path, monkeypatch):
    """Planning called from the lesson's side (as common.setup once did: theory.balanced and the paced spans) is
    counted, and goes over the limit: the count would catch the lab leaking back."""
    flags = ("--layers", "8", "--hidden", "64", "--batch-size", "16", "--steps", "1", "--threads", "1")
    program = launch.program
    monkeypatch.setattr(launch, "program", lambda name: program(name) + program("plan_in_the_lesson"))
    executed = lesson_lines(tmp_path, monkeypatch, "03_1f1b.py", 2, *flags)
    assert {name for name, _ in executed} >= {"theory.py"} and len(executed) > LIMIT, len(executed)
