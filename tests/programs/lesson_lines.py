"""Put into a script by variant: note each line of the lesson's helpers that this rank executes on the lesson's own
path (common.py and guarantees.py whole; schedules.py's and theory.py's function bodies), leaving out the calls
that harness/ or tools/ make into them (what only measures or plans), and write them, as JSON, to
$LESSON_LINES.rank{RANK} when the rank exits."""
import json
import os
import sys

_root = os.environ["PYTHONPATH"].split(os.pathsep)[0]  # the repository (tests.launch's ENV)
_whole = {os.path.join(_root, name) for name in ("common.py", "guarantees.py")}
_bodies = {os.path.join(_root, name) for name in ("schedules.py", "theory.py")}
_lab = tuple(os.path.join(_root, folder) + os.sep for folder in ("harness", "tools"))
_executed = set()


def _called_by_the_lab(frame):
    """Whether the nearest caller outside the helpers is the harness or a tool, not a script."""
    while frame is not None and frame.f_code.co_filename in _whole | _bodies:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_lab)


def _note_lines(frame, event, arg):
    if event == "line":
        _executed.add((os.path.basename(frame.f_code.co_filename), frame.f_lineno))
    return _note_lines


def _on_call(frame, event, arg):
    filename = frame.f_code.co_filename
    if filename in _bodies and frame.f_code.co_name == "<module>":
        return None
    if (filename in _whole or filename in _bodies) and not _called_by_the_lab(frame.f_back):
        return _note_lines
    return None


_exit = os._exit


def _write_and_exit(code):
    with open(f"{os.environ['LESSON_LINES']}.rank{os.environ.get('RANK', '0')}", "w") as file:
        json.dump(sorted(_executed), file)
    _exit(code)


os._exit = _write_and_exit
sys.settrace(_on_call)
