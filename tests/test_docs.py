"""The README and docs/ say only what the repository holds: the README is a guide of at most 300 lines; every
relative link names a file that exists, and every #anchor a heading of that file (GitHub's slugs); every command
in a ```bash block that starts with python, torchrun or diff names files that exist, and passes only flags that
its program's --help lists; and every table that tools/measure.py writes between markers has them in the file
measure.py writes it to (its MARKED), and no file has markers measure.py does not write."""

import ast
import functools
import glob
import os
import re
import shlex

import pytest

from tests.launch import HERE, python

DOCS = ["README.md"] + sorted(os.path.relpath(path, HERE) for path in glob.glob(os.path.join(HERE, "docs", "*.md")))
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
CODE_SPAN = re.compile(r"`[^`\n]*`")
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][\w-]*)")
MARKER = re.compile(r"^<!-- (?:from measure\.py: (\S+)|end of measure\.py's (\S+)) -->$", re.MULTILINE)  # a line


def text_of(path):
    with open(os.path.join(HERE, path)) as file:
        return file.read()


def prose_and_blocks(path):
    """The file's lines outside fenced blocks, and each fenced block as (its language, its lines)."""
    prose, blocks, block = [], [], None
    for line in text_of(path).split("\n"):
        if FENCE.match(line):
            if block is None:
                block = (line[3:].strip(), [])
            else:
                blocks.append(block)
                block = None
        elif block is None:
            prose.append(line)
        else:
            block[1].append(line)
    return prose, blocks


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, each space a -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(path):
    """Every heading's anchor in a markdown file; a repeated heading's anchor gets -1, -2, ... as on GitHub."""
    found = set()
    for line in prose_and_blocks(path)[0]:
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            anchor, count = slug(heading[1]), 0
            while (anchor if count == 0 else f"{anchor}-{count}") in found:
                count += 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def test_the_readme_is_a_guide_of_at_most_300_lines():
    assert len(text_of("README.md").splitlines()) <= 300


@pytest.mark.parametrize("path", DOCS)
def test_every_link_resolves(path):
    broken = []
    for line in prose_and_blocks(path)[0]:
        for target in LINK.findall(CODE_SPAN.sub("code", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file of this repository
                continue
            file, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(os.path.join(HERE, linked)):
                broken.append(f"{target}: no file {linked}")
            elif anchor and (not linked.endswith(".md") or anchor not in anchors(linked)):
                broken.append(f"{target}: no heading of {linked} has the anchor #{anchor}")
    assert not broken, f"{path}: " + "; ".join(broken)


def commands(path):
    """Each command of the file's ```bash blocks, as its words (comments and line continuations resolved)."""
    found = []
    for language, lines in prose_and_blocks(path)[1]:
        if language == "bash":
            for line in "\n".join(lines).replace("\\\n", " ").split("\n"):
                words = shlex.split(line, comments=True)
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the program
                    words = words[1:]
                if words:
                    found.append(words)
    return found


def program_and_flags(words):
    """The file a command runs and the flags it passes it: `python SCRIPT ...` or `torchrun [its options] SCRIPT
    ...`; None for anything else (`python -m pytest`, pip)."""
    if words[0] == "python" and len(words) > 1 and not words[1].startswith("-"):
        script, rest = words[1], words[2:]
    elif words[0] == "torchrun":
        position = next((i for i, word in enumerate(words[1:], 1) if not word.startswith("-")), None)
        if position is None:
            return None
        script, rest = words[position], words[position + 1:]
    else:
        return None
    return script, [word.split("=")[0] for word in rest if word.startswith("--")]


@functools.cache
def flags_of(script):
    """The flags that `python SCRIPT --help` lists in its usage (its descriptions name other programs' flags too)."""
    result = python(script, "--help", timeout=60)
    assert result.returncode == 0, f"python {script} --help exited {result.returncode}:\n{result.stderr[-2000:]}"
    return set(FLAG.findall(result.stdout.split("\n\n")[0])) | {"--help"}


@pytest.mark.parametrize("path", DOCS)
def test_every_command_names_files_and_flags_that_exist(path):
    wrong = []
    for words in commands(path):
        shown = " ".join(words)
        if words[0] == "diff":
            wrong += [f"{shown}: no file {file}" for file in words[1:]
                      if not file.startswith("-") and not os.path.exists(os.path.join(HERE, file))]
            continue
        found = program_and_flags(words)
        if found is None:
            continue
        script, flags = found
        if not os.path.exists(os.path.join(HERE, script)):
            wrong.append(f"{shown}: no file {script}")
            continue
        wrong += [f"{shown}: {script} takes no {flag}" for flag in flags if flag not in flags_of(script)]
    assert not wrong, f"{path}: " + "; ".join(wrong)


def marked():
    """tools/measure.py's MARKED: each file it writes tables into, and the names of those tables."""
    tree = ast.parse(text_of(os.path.join("tools", "measure.py")))
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(target, ast.Name) and target.id == "MARKED" for target in node.targets)]
    return ast.literal_eval(value)


def test_measure_py_writes_every_marked_table_where_it_lies():
    written = marked()
    for path in DOCS:
        names = written.get(path, [])
        markers = [(begin or end, bool(begin)) for begin, end in MARKER.findall(text_of(path))]
        expected = [marker for name in names for marker in ((name, True), (name, False))]
        assert sorted(markers) == sorted(expected), f"{path}: markers {markers}, measure.py writes {names}"
        text = text_of(path)
        for name in names:  # each table's end after its beginning
            assert text.index(f"<!-- from measure.py: {name} -->") < text.index(f"<!-- end of measure.py's {name} -->")
    assert set(written) <= set(DOCS), f"measure.py writes into files that are not docs: {set(written) - set(DOCS)}"


def test_the_readme_says_what_its_baseline_table_shows():
    """'What a pipeline buys': the README says one process is faster on cores it can use together, and the table
    tools/measure.py wrote beneath it shows each pipeline's step over that of one process on the same cores above 1
    (each baseline over itself 1)."""
    text = text_of("README.md")
    assert "one process is faster" in text
    table = text[text.index("<!-- from measure.py: buys -->"):text.index("<!-- end of measure.py's buys -->")]
    rows = {cells[0]: cells[1:] for cells in ([cell.strip() for cell in line.strip("|").split("|")]
                                              for line in table.splitlines()[3:])}
    assert rows["00 one process, 1 thread"][1] == "1.00" and rows["00 one process, 2 threads"][2] == "1.00", rows
    pipelines = [name for name in rows if not name.startswith("00")]
    assert pipelines and all(float(rows[name][2]) > 1 for name in pipelines), rows
