"""One word for one thing, across the code, the docs, the pictures and the tests: B is a full backward, I the
input-gradient half of a split one (the zero-bubble paper's B, PyTorch's I), W the weight half. A kind's name means
one thing everywhere, as the tables name them: a span of a full backward is "full_backward" in every script, of an
I "backward" (docs/reference.md)."""

import ast
import os
import re
import subprocess

import pytest

from tests.launch import HERE

# Uses that can only mean I by B: a W beside a B is there only when the backward is split.
MIXED = [r"\bF, B,? (and )?W\b", r"\bF,B,W\b", r"\bF : B : W\b", r"\bB \+ W\b", r"\bB and W\b", r"\bB, I\b"]
SPLIT_ONLY = ["05_zero_bubble.py", "06_zbv.py"]  # scripts that never run a full backward
SPLITTING = SPLIT_ONLY + ["09_any_schedule.py"]


def tracked(*suffixes):
    names = subprocess.run(["git", "ls-files"], cwd=HERE, capture_output=True, text=True, check=True).stdout.split()
    return [name for name in names if name.endswith(suffixes) and os.path.exists(os.path.join(HERE, name))]


def text(name):
    with open(os.path.join(HERE, name)) as file:
        return file.read()


@pytest.mark.parametrize("pattern", MIXED)
def test_no_b_beside_a_w(pattern):
    """Nowhere, in code or prose, does B stand beside W for the split backward's first half."""
    found = [f"{name}:{number}: {line.strip()}" for name in tracked(".py", ".md") if name != "tests/test_words.py"
             for number, line in enumerate(text(name).splitlines(), 1) if re.search(pattern, line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("script", SPLIT_ONLY)
def test_a_script_that_splits_the_backward_names_no_b(script):
    """05 and 06 run only I and W: no B (B0, B's) in their code, comments or pictures."""
    found = [line for line in text(script).splitlines() if re.search(r"(?<![\w-])B\d*(?![\w-])", line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("script", SPLITTING)
def test_the_function_that_computes_i_is_named_for_i(script):
    """The function that asks autograd for the input gradient alone (torch.autograd.grad) is named for I, and no
    function of a splitting script is named for a backward."""
    functions = [node for node in ast.walk(ast.parse(text(script))) if isinstance(node, ast.FunctionDef)]
    computes_i = [function.name for function in functions
                  if any(isinstance(call, ast.Attribute) and call.attr == "grad" and ast.unparse(call) ==
                         "torch.autograd.grad" for call in ast.walk(function))]
    assert computes_i == ["input_grad_step"], computes_i
    named_backward = [function.name for function in functions if "backward" in function.name]
    assert not named_backward, named_backward


def recorded_kinds(script):
    """(kind, what its span computes) for each `with record(kind, ...)` of the script: "full" where its body runs
    torch.autograd.backward (every gradient at once), "input" where it runs torch.autograd.grad (I alone)."""
    found = []
    for node in ast.walk(ast.parse(text(script))):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call = item.context_expr
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "record" \
                    and isinstance(call.args[0], ast.Constant):
                calls = {ast.unparse(inner.func) for inner in ast.walk(node) if isinstance(inner, ast.Call)}
                what = "full" if "torch.autograd.backward" in calls else "input" if "torch.autograd.grad" in calls \
                    else None
                found.append((call.args[0].value, what))
    return found


@pytest.mark.parametrize("script", sorted(name for name in os.listdir(HERE) if name[:2].isdigit()
                                          and name.endswith(".py")))
def test_a_kind_names_one_computation(script):
    """Every span of a full backward is recorded as "full_backward", every I as "backward", in every script."""
    kinds = recorded_kinds(script)
    assert kinds, script
    for kind, what in kinds:
        assert what != "full" or kind == "full_backward", (script, kind)
        assert what != "input" or kind == "backward", (script, kind)
        assert kind != "backward" or what == "input", (script, kind)
