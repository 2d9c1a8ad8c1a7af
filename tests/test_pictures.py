"""One source for each picture: every schedule picture in the scripts' docstrings, the README and docs/ is
tools/draw.py's drawing of its table, character for character, and no picture is drawn by hand beside them."""

import os
import re

import pytest

import schedules
import theory
from tests.launch import HERE
from tools.draw import draw


def drawn(name, num_ranks, num_microbatches, num_chunks=2, **options):
    """tools/draw.py's picture of a schedules.py table."""
    tables = schedules.table(name, num_ranks, num_microbatches, num_chunks)
    return draw(tables, schedules.SCHEDULES[name][1], **options)


def side_by_side(labels):
    """07's and 08's picture: two 1F1B pipelines of 3 stages (m = 4), each row ending in the gradient all-reduce."""
    return "\n".join(draw(schedules.one_f_one_b(3, 4), labels=labels[half:half + 3], then="AR") for half in (0, 3))


# each file's pictures, in the order they appear
PICTURES = {
    "01_naive.py": [drawn("gpipe", 4, 1)],
    "02_gpipe.py": [drawn("gpipe", 4, 4)],
    "03_1f1b.py": [drawn("1f1b", 4, 8)],
    "04_interleaved_1f1b.py": [drawn("interleaved-1f1b", 2, 4, 2)],
    "05_zero_bubble.py": [drawn("zb-h1", 4, 8)],
    "06_zbv.py": [drawn("zbv", 3, 5)],
    "07_pp_dp.py": [side_by_side([f"rank {rank}" for rank in range(6)])],
    "08_3d.py": [side_by_side([f"ranks {2 * stage}, {2 * stage + 1}".ljust(12) for stage in range(6)])],
    "09_any_schedule.py": [drawn("dualpipev", 2, 5, cost=theory.UNIT_COSTS)],
    "README.md": [drawn("gpipe", 4, 4), drawn("1f1b", 4, 8)],
    "docs/design.md": [drawn("interleaved-1f1b", 4, 8, 2), drawn("zb-h1", 4, 8), drawn("zbv", 4, 8)],
}
ROW = re.compile(r"^( *)ranks? \d+(, \d+)? {2,}\S")  # a picture's row: "rank 3  F0 ..." or "ranks 0, 1    F0 ..."


def pictures_in(path):
    """Each block of picture rows in a file, its indent taken off."""
    blocks, rows = [], []
    for line in open(os.path.join(HERE, path)).read().split("\n") + [""]:
        row = ROW.match(line)
        if row:
            rows.append(line[len(row[1]):])
        elif rows:
            blocks.append("\n".join(rows))
            rows = []
    return blocks


@pytest.mark.parametrize("path", list(PICTURES))
def test_every_picture_is_the_tables_drawing(path):
    assert pictures_in(path) == PICTURES[path]


def test_no_other_file_draws_a_schedule():
    """Pictures anywhere else in the lesson and its docs would be drawn by hand: there are none."""
    for folder in ("", "docs", "harness", "tools"):
        for name in sorted(os.listdir(os.path.join(HERE, folder))):
            path = os.path.join(folder, name)
            if name.endswith((".py", ".md")) and path not in PICTURES:
                assert not pictures_in(path), path
