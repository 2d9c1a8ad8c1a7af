"""The harness can be deleted: each numbered script with every harness line removed, by the rule below, and a module
of no-ops in place of harness/ (so common.py's own calls into it do nothing either), starts, trains, gives the
baseline's gradients in float64 and exits 0, on 2 and 4 ranks.

The rule, applied to the script's syntax tree: the `from harness import ...` line goes; a statement that is a call of
a name it imported goes (an `if` left empty goes with it); a `with` loses each item that calls one, and a `with` left
with none is unwrapped (its body stays); `track(x)` reads as `x`. A harness call anywhere else fails the test: the
rule would not know what the script means by it."""

import ast
import re
import shutil
import subprocess
import sys

import pytest
import torch

import common
import harness.flags
from tests import launch
from tests.launch import EXACT, SIZE, assert_close, start_ranks, wait_ranks

# Run first in the stripped script: the gradients of the first optimizer step, by parameter.
CAPTURE = '''
import torch as _torch
_first_grads = {}
_adam_step = _torch.optim.Adam.step


def _capture(optimizer, *args, **kwargs):
    if not _first_grads:
        _first_grads.update({id(param): param.grad.detach().clone() for group in optimizer.param_groups
                             for param in group["params"]})
    return _adam_step(optimizer, *args, **kwargs)


_torch.optim.Adam.step = _capture
'''
# Run last, before the script's clean exit: those gradients by name, as the baseline's dump names them.
SAVE = '''
_named = {}
for _module in [globals()[name] for name in ("model", "stage") if name in globals()] + globals().get("stages", []):
    for _name, _param in _module.named_parameters():
        _grad = _first_grads[id(_param)]
        if hasattr(_param, "partition_dim"):  # 08: this shard's slice, joined with the others' in shard order
            _slices = [_torch.empty_like(_grad) for _ in range(mesh.size(2))]
            _torch.distributed.all_gather(_slices, _grad.contiguous(), group=mesh.get_group("tp"))
            _grad = _torch.cat(_slices, _param.partition_dim)
        _named[_name] = _grad
_torch.save(_named, f"{_OUT}/rank{_torch.distributed.get_rank()}.pt")
'''


class Strip(ast.NodeTransformer):
    """The rule: every harness line of a script removed."""

    def __init__(self):
        self.names = set()  # what the script imports from harness

    def is_harness(self, node):
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.names

    def visit_ImportFrom(self, node):
        if node.module == "harness":
            self.names.update(alias.asname or alias.name for alias in node.names)
            return None
        return node

    def visit_Expr(self, node):
        return None if self.is_harness(node.value) else self.generic_visit(node)

    def visit_With(self, node):
        node.items = [item for item in node.items if not self.is_harness(item.context_expr)]
        self.generic_visit(node)
        return node if node.items else node.body

    def visit_If(self, node):
        self.generic_visit(node)
        if not node.body:
            node.body = [ast.Pass()]
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        if self.is_harness(node):
            assert node.func.id == "track", f"line {node.lineno}: {node.func.id}(...) inside an expression"
            return node.args[0]
        return node


def stripped(script):
    """The script's text with every harness line removed (Strip), checked to import and name nothing of it."""
    strip = Strip()
    tree = ast.fix_missing_locations(strip.visit(ast.parse(open(f"{launch.HERE}/{script}").read())))
    left = [node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in strip.names]
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
               and "harness" in [getattr(node, "module", None), *[alias.name for alias in node.names]]]
    assert strip.names and not left and not imports, f"{script}: harness names the rule left: {left}"
    return ast.unparse(tree)


def run_stripped(tmp_path, script, nproc, *flags):
    """Run the stripped script with no-ops for harness/; each rank's gradients of the first step, by name."""
    text = stripped(script)
    end = text.rindex("\nfinish()")  # the script's own last line: its clean exit
    prefix = f"_OUT = {str(tmp_path)!r}\n" + CAPTURE
    (tmp_path / script).write_text(prefix + text[:end] + "\n" + SAVE + text[end:] + "\n")
    (tmp_path / "harness").mkdir()
    shutil.copy(f"{launch.HERE}/tests/programs/no_harness.py", tmp_path / "harness" / "__init__.py")
    command = [launch.sys.executable, str(tmp_path / script), *flags]
    codes = wait_ranks(start_ranks(command, nproc, tmp_path), 120)
    errors = "".join((tmp_path / f"stderr{rank}").read_text() for rank in range(max(nproc, 1)))
    assert codes == [0] * max(nproc, 1), errors
    grads = {}
    for rank in range(max(nproc, 1)):
        grads.update(torch.load(tmp_path / f"rank{rank}.pt"))
    return grads


LAYOUT = ("--micro-batches", "--data-parallel", "--tensor-parallel", "--schedule")  # what the baseline does not take
# (script, ranks, flags): every numbered script on 2 and 4 ranks (the baseline in one process), 07 and 08 with two
# pipelines and two shards a stage where 4 ranks allow it, 09 with the V's tables too
CASES = [
    ("00_baseline.py", 0, ()),
    ("01_naive.py", 2, ()), ("01_naive.py", 4, ()),
    ("02_gpipe.py", 2, ("--micro-batches", "3")), ("02_gpipe.py", 4, ("--micro-batches", "4")),
    ("03_1f1b.py", 2, ("--micro-batches", "3")), ("03_1f1b.py", 4, ("--micro-batches", "7")),
    ("04_interleaved_1f1b.py", 2, ("--micro-batches", "4")), ("04_interleaved_1f1b.py", 4, ("--micro-batches", "8")),
    ("05_zero_bubble.py", 2, ("--micro-batches", "3")), ("05_zero_bubble.py", 4, ("--micro-batches", "7")),
    ("06_zbv.py", 2, ("--micro-batches", "4")), ("06_zbv.py", 4, ("--micro-batches", "8", "--layers", "9")),
    ("07_pp_dp.py", 2, ("--micro-batches", "3")), ("07_pp_dp.py", 4, ("--micro-batches", "2", "--data-parallel", "2")),
    ("08_3d.py", 2, ("--micro-batches", "3")),
    ("08_3d.py", 4, ("--micro-batches", "2", "--tensor-parallel", "2", "--hidden", "24")),
    ("09_any_schedule.py", 2, ("--micro-batches", "4")),
    ("09_any_schedule.py", 4, ("--micro-batches", "8", "--schedule", "dualpipev", "--layers", "9")),
    ("09_any_schedule.py", 4, ("--micro-batches", "5", "--schedule", "zbv", "--layers", "9")),
]


@pytest.mark.parametrize("script,nproc,flags", CASES, ids=[f"{s[:2]}-n{n}-{'-'.join(f[1::2])}" for s, n, f in CASES])
def test_a_script_without_its_harness_trains_exactly(tmp_path, runs, script, nproc, flags):
    given = dict(zip(SIZE[::2], SIZE[1::2])) | dict(zip(flags[::2], flags[1::2]))  # a later flag wins
    model = [word for flag, value in given.items() if flag not in LAYOUT for word in (flag, value)]
    baseline = runs("00_baseline.py", 0, *model)
    # --threads is the harness's (OMP_NUM_THREADS=1 holds each rank to one thread without it)
    grads = run_stripped(tmp_path, script, nproc, *[word for flag, value in given.items() if flag != "--threads"
                                                    for word in (flag, value)])
    assert_close(grads, baseline.grads, EXACT, f"{script} without its harness: gradients after the first backward")


def test_the_rule_removes_every_harness_line():
    """What is left of 03 names nothing of the harness and keeps the lesson: its parser, its training, its exit."""
    text = stripped("03_1f1b.py")
    for kept in ("parse_args(", "train_step(", "optimizer.step()", "finish()"):
        assert kept in text, kept
    for gone in ("record(", "timed_step(", "log_step(", "report(", "dump("):
        assert gone not in text, gone


def test_the_lessons_defaults_are_the_ones_the_harness_declares():
    """tools/plan.py and tools/draw.py take --layers, --micro-batches, ... as the harness declares them: at the
    defaults the scripts run with (common.FLAGS), or a plan would be of another model than the README's command."""
    for flag, keywords in harness.flags.FLAGS.items():
        name = flag[2:].replace("-", "_")
        if name in common.FLAGS and "default" in keywords:
            assert keywords["default"] == common.FLAGS[name], flag


@pytest.mark.parametrize("script", ["08_3d.py", "09_any_schedule.py"])
def test_every_flag_says_what_it_means(script):
    """The lesson declares its flags bare; the harness gives each its help: none is left without."""
    result = subprocess.run([sys.executable, script, "--help"], cwd=launch.HERE, capture_output=True, text=True,
                            env=launch.ENV, timeout=60)
    options = result.stdout.split("options:")[1]
    blocks = re.split(r"\n(?=  -)", options.strip("\n"))  # a flag's lines each: its name and metavar, its help
    helps = {}
    for block in blocks:
        first, *rest = block.splitlines()
        name_and_help = re.split(r"\s{2,}", first.strip(), maxsplit=1)
        helps[name_and_help[0].split()[0]] = " ".join(name_and_help[1:] + [line.strip() for line in rest])
    assert {"--layers", "--micro-batches", "--pace", "--dump-grads"} <= set(helps), sorted(helps)
    assert all(len(text.split()) >= 2 for text in helps.values()), helps
