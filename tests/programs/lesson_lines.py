"""Put into a script by variant: note each definition of the lesson's helpers (every module of the repository outside
harness/, tools/ and tests/ that is not a numbered script or a test) that this rank's own lines reach, leaving out
the calls that harness/ or tools/ make into them (what only measures or plans), and write each one's (file, first
line), as JSON, to $LESSON_LINES.rank{RANK} when the rank exits."""
import json
import os
import sys
import threading

_root = os.environ["PYTHONPATH"].split(os.pathsep)[0]  # the repository (tests.launch's ENV)
_lesson = {os.path.join(_root, name) for name in os.listdir(_root) if name.endswith(".py")
           and not name[:2].isdigit() and not name.startswith(("test_", "conftest", "_"))}
_lab = tuple(os.path.join(_root, folder) + os.sep for folder in ("harness", "tools", "tests"))
_reached = set()


def _called_by_the_lab(frame):
    """Whether the nearest caller outside the helpers is the harness or a tool, not a script."""
    while frame is not None and frame.f_code.co_filename in _lesson:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_lab)


def _on_call(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_filename in _lesson and code.co_name != "<module>" \
            and not _called_by_the_lab(frame.f_back):
        _reached.add((os.path.basename(code.co_filename), code.co_firstlineno))


_exit = os._exit


def _write_and_exit(code):
    sys.settrace(None)
    with open(f"{os.environ['LESSON_LINES']}.rank{os.environ.get('RANK', '0')}", "w") as file:
        json.dump(sorted(_reached), file)
    _exit(code)


os._exit = _write_and_exit
sys.settrace(_on_call)
threading.settrace(_on_call)
