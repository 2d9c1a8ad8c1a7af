"""Each rule in harness/guarantees.py is needed: broken through its name (a prepended line that replaces it), the
guarantee it keeps fails where the suite checks it. The unbroken runs are checked in the other modules."""

import subprocess
import sys

from tests.launch import (
    ENV,
    MEMORY,
    SIZE,
    SYNC,
    launch,
    pipelined,
    program,
    start_ranks,
    torchrun,
    variant,
    wait_ranks,
)


def without(rule, replacement="lambda *args, **kwargs: None"):
    """A prepended line that replaces one rule of harness/guarantees.py."""
    return f"from harness import guarantees\nguarantees.{rule} = {replacement}\n"


def test_release_on_arrival(runs, tmp_path):
    """Without it, 03's gradient sends wait for the end of the step: at 4 ranks and 8 micro-batches, a rank
    then holds more than its micro-batches in flight and 3 tensors in transit (test_memory_follows_inflight)."""
    world, m, unit = 4, 8, 2 * 24 * 8
    kept = pipelined(runs, "03_1f1b.py", world, m, size=MEMORY).summary
    script = variant(tmp_path, "03_1f1b.py", prepend=without("release_on_arrival"))
    piled = launch(tmp_path, script, world, *MEMORY, "--micro-batches", str(m)).summary
    extra = [(held - activations) / unit for held, activations in
             zip(piled["peak_held_bytes"], piled["peak_activation_bytes"])]
    assert max(extra) > 3, extra
    assert max(piled["peak_held_bytes"]) > max(kept["peak_held_bytes"])


def test_hold_back(tmp_path):
    """Without it, --sync-sends lets two neighbours that both send first run to the end, and a send
    overtake a receive posted before it."""
    for script, prepend, flags in (("03_1f1b.py", program("split_pairs"), ("--micro-batches", "4")),
                                   ("01_naive.py", program("early_receive"), ())):
        launch(tmp_path, variant(tmp_path, script, prepend + without("hold_back")), 2, *SIZE, *flags, *SYNC,
               "--timeout", "5")  # exits 0


def receives(tmp_path, *flags, prepend=""):
    path = tmp_path / f"misordered{len(list(tmp_path.glob('misordered*')))}.py"
    text = program("misordered_receives")
    path.write_text(text.replace('"""\n', '"""\n' + prepend, 1))  # after the docstring, which --help uses
    out = tmp_path / path.stem
    out.mkdir()
    assert wait_ranks(start_ranks([sys.executable, str(path), *SIZE, *flags], 2, out), 60) == [0, 0]
    return (out / "stdout1").read_text().split()[-1]


def test_wire_tag(tmp_path):
    """gloo matches by tag, so a misordered pair of receives still gets the right tensors; --sync-sends,
    like NCCL, matches by order and swaps them, which the gradient check then sees. Without the rule,
    --sync-sends would match by tag too and the misorder would pass unseen."""
    assert receives(tmp_path) == "matched"
    assert receives(tmp_path, *SYNC) == "swapped"
    assert receives(tmp_path, *SYNC, prepend=without("wire_tag", "lambda tag: tag")) == "matched"


def test_a_link_to_itself(tmp_path):
    """The lesson's own (common._local): where it keeps nothing, the V's bottom rank hands its chunk-1 forward
    nothing, and the run fails."""
    forgetful = "import common\ncommon._local = type('Forgetful', (dict,), {'__setitem__': lambda *args: None})()\n"
    script = variant(tmp_path, "06_zbv.py", prepend=forgetful)
    out = tmp_path / "a_link_to_itself"
    out.mkdir()
    command = [sys.executable, script, *SIZE, "--micro-batches", "3", "--timeout", "5"]
    codes = wait_ranks(start_ranks(command, 2, out), 60)
    assert codes != [0, 0], codes


def test_wait(tmp_path):
    """Without it, a wait that times out is a traceback, not one sentence naming the rank waited for."""
    script = variant(tmp_path, "03_1f1b.py", prepend=program("split_pairs") + without(
        "wait", "lambda message: message.request.wait()"))
    result = subprocess.run(torchrun(2, script, *SIZE, "--micro-batches", "4", *SYNC, "--timeout", "3"),
                            env=ENV, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "gave up in" not in result.stderr and "Traceback" in result.stderr
