"""What a learner reads to follow a script: the script, plus every function and class of the lesson's helpers
(common.py, schedules.py, theory.py: every module outside harness/, tools/ and tests/) that the script's own lines
reach when it runs, each counted whole (the outermost definition that holds it, def to end, docstring included),
plus those files' module-level code lines (no blank or comment lines). What only measures, plans or paces is the
harness's and the tools': their calls into the helpers are not the learner's path, and a lab feature adds no line
to it (tests/programs/lesson_lines.py notes what each rank reaches)."""

import ast
import json
import os

import pytest

from tests import launch
from tests.launch import HERE, start_ranks, variant, wait_ranks

TINY = ("--layers", "4", "--hidden", "16", "--batch-size", "8", "--steps", "2", "--threads", "1")
# the lines a learner reads for each script, at most (09 with its default table and with the V's longest). The
# lesson's own flags and clean exit (common.parse_args, FLAGS, finish: what a script needs with the harness deleted,
# tests/test_without_harness.py) hold 01, 03, 05 and 09 above 280, 320, 370 and 600: these guard today's counts.
LIMITS = {"01_naive.py": 296, "03_1f1b.py": 331, "05_zero_bubble.py": 378, "06_zbv.py": 420, "09_any_schedule.py": 618}


def reached(tmp_path, monkeypatch, script, nproc, *flags):
    """The (file, first line) of each helper definition that any rank of `script` reached on the lesson's path."""
    monkeypatch.setitem(launch.ENV, "LESSON_LINES", str(tmp_path / "lines"))
    path = variant(tmp_path, script, launch.program("lesson_lines"))
    command = [launch.sys.executable, path, *TINY, *flags]
    assert wait_ranks(start_ranks(command, nproc, tmp_path), 120) == [0] * nproc
    return {tuple(line) for rank in range(nproc) for line in json.loads((tmp_path / f"lines.rank{rank}").read_text())}


def lines_read(script, definitions):
    """The script's lines, plus each helper file's reached definitions whole and its module-level code lines."""
    total = len(open(os.path.join(HERE, script)).read().splitlines())
    for name in sorted({name for name, _ in definitions}):
        text = open(os.path.join(HERE, name)).read()
        tops = [(node.lineno - len(getattr(node, "decorator_list", [])), node.end_lineno)
                for node in ast.parse(text).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        firsts = {line for other, line in definitions if other == name}
        total += sum(end - start + 1 for start, end in tops if any(start <= line <= end for line in firsts))
        inside = {line for start, end in tops for line in range(start, end + 1)}
        total += sum(1 for number, line in enumerate(text.splitlines(), 1)
                     if number not in inside and line.strip() and not line.strip().startswith("#"))
    return total


@pytest.mark.parametrize("script,nproc,flags", [
    ("01_naive.py", 2, ()), ("03_1f1b.py", 2, ()), ("03_1f1b.py", 4, ("--micro-batches", "4")),
    ("03_1f1b.py", 2, ("--pace", "1")), ("03_1f1b.py", 2, ("--partition", "balanced", "--classes", "64")),
    ("05_zero_bubble.py", 2, ()), ("06_zbv.py", 2, ()), ("09_any_schedule.py", 2, ()),
    ("09_any_schedule.py", 2, ("--schedule", "dualpipev")),
], ids=["01", "03", "03-n4", "03-paced", "03-balanced", "05", "06", "09", "09-dualpipev"])
def test_a_learner_reads_at_most_the_limit(tmp_path, monkeypatch, script, nproc, flags):
    """The README's commands at a tiny size, and 03 with the lab's flags: pacing and planning add no line."""
    definitions = reached(tmp_path, monkeypatch, script, nproc, *flags)
    assert "common.py" in {name for name, _ in definitions}  # the count reaches the helpers
    assert lines_read(script, definitions) <= LIMITS[script], sorted(definitions)


def test_the_count_sees_the_lab_put_back_on_the_lesson_path(tmp_path, monkeypatch):
    """Planning called from the lesson's side (as common.setup once did: theory.balanced and the paced spans) is
    counted, and goes over the limit: the count would catch the lab leaking back."""
    program = launch.program
    monkeypatch.setattr(launch, "program", lambda name: program(name) + program("plan_in_the_lesson"))
    definitions = reached(tmp_path, monkeypatch, "03_1f1b.py", 2)
    assert ("theory.py" in {name for name, _ in definitions}
            and lines_read("03_1f1b.py", definitions) > LIMITS["03_1f1b.py"]), sorted(definitions)
