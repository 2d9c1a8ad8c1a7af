"""Rerun every measured table and picture that the README and docs/ show, one run at a time, and
write docs/measured.md, docs/img/*.svg and the tables between markers in the files of MARKED. Run it on an
otherwise idle machine.

    python tools/measure.py                                # about 45 minutes on 2 cores
    python tools/measure.py --quick --out /tmp/rehearsal   # every run at its smallest, one round: a rehearsal
    python tools/measure.py --recompute-rounds 0           # without --recompute's 8 rounds of step times (2.5 minutes)

Each run goes through torchrun and prints one JSON summary line (--json), which is all this reads.
"""

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root: the scripts, README.md
sys.path.insert(0, ROOT)  # the lesson's modules, and tools as a package
import schedules  # noqa: E402
from harness.meters import COMPUTE  # noqa: E402
from harness.pictures import COLOURS  # noqa: E402
from tools import fit, paper  # noqa: E402
from tools.held import held_count, held_theory  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--quick", action="store_true", help="smallest sizes, one round: numbers that mean nothing")
parser.add_argument("--out", default=ROOT, help="where docs/measured.md and docs/img/ go (default: this repository)")
parser.add_argument("--recompute-rounds", type=int, default=8, metavar="N",
                    help="rounds of 03 without and with --recompute at the default size (0: leave the section out)")
args = parser.parse_args()
os.makedirs(os.path.join(args.out, "docs", "img"), exist_ok=True)
scratch = tempfile.mkdtemp(prefix="measure-")  # traces, and the output of a run that failed

# The sizes: the full run's, or the smallest that still runs every schedule (--quick).
PACED = "--layers 8 --hidden 64 --batch-size 32 --steps 3 --pace 50"
MEMORY = "--layers 16 --hidden 24 --batch-size 16 --micro-batches 8 --steps 3 --dtype float64 --threads 1"
SPEED = "--batch-size 256 --hidden 1024 --layers 16 --micro-batches 8"  # the default size
SPEED_STEPS, OVERHEAD_STEPS, DEFAULT = "--steps 10", "--steps 20", ""  # DEFAULT: the README's first command
PP_DP = "--layers 7 --hidden 24 --steps 8 --threads 1 --lr 0.01 --dtype float64 --pace 30"
SPEED_ROUNDS, PP_DP_ROUNDS, OVERHEAD_RUNS, ACCOUNT_ROUNDS, PYTORCH_ROUNDS = 4, 4, 3, 2, 10
PYTORCH_STEPS = "--steps 20"  # a round's ratio moves by several percent on shared cores: more steps, less noise
HEAVY = "--layers 16 --hidden 1024 --classes 16384 --batch-size 256 --micro-batches 8 --steps 6"  # a heavy head
HEAVY_ROUNDS = 3
PREDICT = "--layers 12 --hidden 768 --batch-size 192 --micro-batches 6 --steps 10"  # plan.py's prediction, 2 ranks
PREDICT_ROUNDS = 5
SWEEP_ROUNDS = 3  # the m sweep's rounds, and the baseline's beside the pipelines
README_PACED = PACED.replace("--hidden 64", "--hidden 1024")  # the README's pacing example: a head 10/1024 of a block
if args.quick:
    PACED = "--layers 8 --hidden 16 --batch-size 16 --steps 2 --pace 10"
    MEMORY = MEMORY.replace("--steps 3", "--steps 2")
    SPEED, SPEED_STEPS, OVERHEAD_STEPS = "--batch-size 16 --hidden 32 --layers 4 --micro-batches 4", "--steps 3", ""
    DEFAULT = "--hidden 32 --batch-size 16 --steps 6"
    PP_DP = PP_DP.replace("--steps 8", "--steps 2").replace("--pace 30", "--pace 10")
    HEAVY = "--layers 4 --hidden 32 --classes 512 --batch-size 16 --micro-batches 4 --steps 3"
    PREDICT = "--layers 4 --hidden 32 --batch-size 16 --micro-batches 4 --steps 3"
    SPEED_ROUNDS = PP_DP_ROUNDS = OVERHEAD_RUNS = HEAVY_ROUNDS = PREDICT_ROUNDS = ACCOUNT_ROUNDS = SWEEP_ROUNDS = 1
    PYTORCH_ROUNDS, PYTORCH_STEPS = 2, "--steps 3"
    README_PACED = PACED
    args.recompute_rounds = min(args.recompute_rounds, 1)

started = time.time()
git = lambda *command: subprocess.run(["git", *command], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
# the code the figures come from, read before this run rewrites its own outputs (docs/img/, the tables between markers)
commit, dirty = git("rev-parse", "--short", "HEAD"), " (with uncommitted changes)" * bool(git("status", "--porcelain",
                                                                                             "--untracked-files=no"))
commands = []  # what ran, as a reader would type it, for the section being measured


def run(script, ranks, flags):
    """One torchrun of script on this host: its JSON summary, and the run's wall time (start-up included)."""
    flags = " ".join(flags.split() + ["--json"] * (script != "tools/torch_schedules.py"))  # PyTorch's prints it always
    shown = f"torchrun --nproc_per_node={ranks} {script} {flags}"
    for folder in (os.path.join(args.out, ""), os.path.join(scratch, "")):
        shown = shown.replace(folder, "")
    commands.extend([shown] * (shown not in commands))
    print(f"[{time.time() - started:4.0f} s] {shown}", flush=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", script,
               *flags.split()]
    begin = time.time()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:  # the run's own sentences and exceptions, once each, then where the rest is
        with open(os.path.join(scratch, "failed.log"), "w") as file:
            file.write(result.stdout + result.stderr)
        errors = dict.fromkeys(line for line in (result.stdout + result.stderr).splitlines()
                               if line.startswith("error:") or "Error: " in line)
        sys.exit("\n".join([f"failed ({result.returncode}): {shown}", *errors, f"its output: {file.name}"]))
    return dict(json.loads(lines[-1]), wall_s=time.time() - begin)


def ran():
    """The commands of the section just measured, as a block for the reader; then start the next section."""
    block = "```bash\n" + "\n".join(commands) + "\n```"
    commands.clear()
    return block


median = statistics.median


def per_rank(values, separator=" "):
    return separator.join(str(value) for value in values)


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def gradient_hop(trace, sender, receiver):
    """Median ms from the end of a full backward on `sender` to the start of the same micro-batch's on `receiver`."""
    with open(trace) as file:
        events = [e for e in json.load(file)["traceEvents"]
                  if e.get("cat") == "full_backward" and e["args"]["step"] > 0]
    ends = {(e["args"]["step"], e["args"]["micro_batch"]): e["ts"] + e["dur"] for e in events if e["pid"] == sender}
    return median([(e["ts"] - ends[e["args"]["step"], e["args"]["micro_batch"]]) / 1e3
                   for e in events if e["pid"] == receiver])


out = []  # the sections of measured.md, in order
# Each file's tables between markers, <!-- from measure.py: NAME --> ... <!-- end of measure.py's NAME -->, by name;
# tests/test_docs.py reads this mapping and checks that every file has the markers of its names, and no others.
MARKED = {"README.md": ["paced", "accounting", "buys"],
          "docs/design.md": ["pytorch", "micro-batches", "rows", "partition", "schedules", "recompute"],
          "docs/planning.md": ["plan", "paper", "dualpipe", "predict"]}
marked_tables = {}  # NAME -> its table (or lines), as measured in this run

# (1) Paced: every computation padded to the pace, four ranks, the pictures drawn by --svg.
rows, paced = [], {}
for name, script, flags, m in [
        ("01 naive", "01_naive", "", 1), ("02 GPipe", "02_gpipe", "--micro-batches 8", 8),
        ("03 1F1B", "03_1f1b", "--micro-batches 8", 8),
        ("04 interleaved, v = 2", "04_interleaved_1f1b", "--micro-batches 8 --virtual-stages 2", 8),
        ("05 ZB-H1", "05_zero_bubble", "--micro-batches 8", 8), ("06 ZB-V", "06_zbv", "--micro-batches 8", 8),
        ("07, 2 stages x 2 copies", "07_pp_dp", "--micro-batches 4 --data-parallel 2", 4),
        ("08, 2 stages x 2 shards", "08_3d", "--micro-batches 4 --tensor-parallel 2", 4)]:
    s = run(f"{script}.py", 4, f"{PACED} {flags} --svg {os.path.join(args.out, 'docs', 'img', script + '.svg')}")
    paced[script] = s
    rows.append([name, m, f"{s['bubble_busiest']:.3f}", f"{s['bubble_theory']:.3f}",
                 f"{s['bubble_busiest'] - s['bubble_theory']:+.3f}", s["paced_overruns"],
                 per_rank(s["sends_before_receive"])])
s = run("03_1f1b.py", 4, f"{README_PACED} --micro-batches 8")  # the README's pacing example, at the default width
readme_paced = f"the busiest rank's bubble {s['bubble_busiest']:.3f}, its theory {s['bubble_theory']:.3f}"
marked_tables["paced"] = f"Measured by `tools/measure.py` (the command above, {s['steps']} steps): {readme_paced}."
out.append(f"""## Paced: each schedule alone

Four ranks, every computation padded to the pace by sleeping, one run each; the pictures
`docs/img/*.svg` are the last step of each run. Sends before their receive are counted over the
measured steps (all but the first); overruns are computations that took longer than the pace.

{ran()}

{table(["script", "m", "busiest rank's bubble", "theory", "excess", "overruns",
        "sends before their receive, per rank"], rows)}

The last command is the README's pacing example, 03 at the default width, where the head is 10/1024 of a
block: {readme_paced}.""")

# (2) Memory at a small size: exact, whatever the timing.
unit = 2 * 24 * 8  # one micro-batch: 16 / 8 rows x 24, float64
rows, largest, memory = [], {}, {}
for name, script, flags in [("02 GPipe", "02_gpipe", ""), ("03 1F1B", "03_1f1b", ""),
                            ("04 interleaved, v = 2", "04_interleaved_1f1b", "--virtual-stages 2"),
                            ("05 ZB-H1", "05_zero_bubble", ""), ("06 ZB-V", "06_zbv", "")]:
    s = run(f"{script}.py", 4, f"{MEMORY} {flags}")
    largest[script], memory[script] = max(s["peak_held_bytes"]), s
    rows.append([name, per_rank(s["peak_inflight_microbatches"]), per_rank(s["expected_inflight_microbatches"]),
                 per_rank(s["peak_activation_bytes"]), per_rank(s["peak_held_bytes"]),
                 per_rank(f"{held / unit:.2f}" for held in s["peak_held_bytes"]),
                 f"{largest[script] / largest['03_1f1b']:.2f}" if "03_1f1b" in largest else ""])
out.append(f"""## Memory at a small size

Four ranks, one run each. In-flight counts and bytes do not depend on timing: they are exact. A
unit is one micro-batch's `2 x 24` float64 tensor, {unit} bytes.

{ran()}

{table(["script", "in flight, ranks 0-3", "theory", "activations (bytes)", "held (bytes)", "held (units)",
        "largest held / 03's"], rows)}""")

# (2b) --recompute: the same runs with the flag, each rank's held bytes beside the theory (tools/held.py).
rows, held_by_flag = [], {}  # held_by_flag: name -> flag -> held, ranks 0-3, for docs/design.md's table
for name, script in [("02 GPipe", "02_gpipe"), ("03 1F1B", "03_1f1b"), ("05 ZB-H1", "05_zero_bubble"),
                     ("06 ZB-V", "06_zbv")]:
    blocks = 16 // 4 // (2 if script == "06_zbv" else 1)  # a stage's, or a chunk's, at 16 layers on 4 ranks
    for flag, s in (("off", memory[script]), ("on", run(f"{script}.py", 4, f"{MEMORY} --recompute"))):
        if script == "06_zbv":  # counted over its table
            theory = held_count(schedules.zbv(4, 8), "v", [blocks] * 8, 2, 24, recompute=flag == "on")
        else:
            theory = held_theory(f"{script}.py", 4, 8, blocks, 2, 24, recompute=flag == "on")
        held_units = "  ".join(f"{round(held / unit, 1):g}" for held in s["peak_held_bytes"])
        held_by_flag.setdefault(name, {})[flag] = held_units
        rows.append([name, flag, per_rank(f"{held / unit:.2f}" for held in s["peak_held_bytes"]),
                     per_rank(f"{units:.2f}" for units in theory),
                     per_rank(f"{saved / unit:.2f}" for saved in s["peak_activation_bytes"]),
                     f"{max(s['peak_held_bytes']) / max(memory[script]['peak_held_bytes']):.2f}"])
out.append(f"""## --recompute: memory at the small size

The runs of "Memory at a small size", and the same with `--recompute`, in units of one micro-batch's
`2 x 24` float64 tensor: each rank's peak held bytes beside the theory (docs/design.md,
*Recomputation*; `tools/held.py`'s `held_theory`, which the tests hold every rank to), and the peak of what
autograd saves. With the flag a micro-batch keeps only its stage's input from F to its backward (B, or I in 05 and
06), and autograd saves one micro-batch's activations at a time, in that backward.

{ran()}

{table(["script", "--recompute", "held, ranks 0-3", "theory", "activations, ranks 0-3", "largest held / without"],
       rows)}""")

# (2c) A schedule is a table: 09 runs every table of schedules.py, paced, and at the memory size, n = 4, m = 8.
rows, table_rows = [], []
for name in schedules.SCHEDULES:
    svg = f" --svg {os.path.join(args.out, 'docs', 'img', '09_dualpipev.svg')}" * (name == "dualpipev")
    s = run("09_any_schedule.py", 4, f"{PACED} --micro-batches 8 --schedule {name}{svg}")
    held = run("09_any_schedule.py", 4, f"{MEMORY} --schedule {name}")
    largest = max(held["peak_held_bytes"])
    rows.append([name, s["virtual_stages"], f"{s['bubble_busiest']:.3f}", f"{s['bubble_theory']:.3f}",
                 f"{s['bubble_busiest'] - s['bubble_theory']:+.3f}", s["paced_overruns"],
                 per_rank(held["peak_inflight_microbatches"]),
                 per_rank(f"{held_bytes / unit:.2f}" for held_bytes in held["peak_held_bytes"]),
                 f"{largest / max(memory['06_zbv']['peak_held_bytes']):.2f}"])
    table_rows.append(f"| `{name}` | {s['bubble_theory']:.3f} | {s['bubble_busiest']:.3f} | {largest / unit:.1f} "
                       f"| {largest / max(memory['06_zbv']['peak_held_bytes']):.2f} |")
out.append(f"""## A schedule is a table: 09

09 runs each table of `schedules.py` on four ranks, m = 8: paced at the size of "Paced: each schedule
alone" (the bubble beside its table's replay, F, I and W one unit, a full backward two), and at the
memory size (held bytes in units of one micro-batch's `2 x 24` float64 tensor; the largest beside 06's).

{ran()}

{table(["schedule", "chunks a rank", "busiest rank's bubble", "theory", "excess", "overruns",
        "in flight, ranks 0-3", "held (units), ranks 0-3", "largest held / 06's"], rows)}""")
marked_tables["schedules"] = "\n".join(["| n = 4, m = 8 | bubble, theory | bubble, paced | largest held (units) | "
                                         "largest held / 06's |", "|---|---|---|---|---|"] + table_rows)

# (2d) Planning at scale: tools/plan.py, every schedule and the search, m = 4n, F : I : W = 1 : 2 : 1, no processes.
plan_rows, by_schedule = [], {}  # by_schedule: name -> its cells in docs/planning.md, n by n
for stages in (8, 32, 64):
    command = [sys.executable, "tools/plan.py", "--stages", str(stages), "--micro-batches", str(4 * stages),
               "--costs", "1,2,1", "--json"]
    commands.append(" ".join(["python", *command[1:]]))
    begin = time.time()
    planned = [json.loads(line) for line in subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                                           check=True).stdout.splitlines()]
    seconds = time.time() - begin
    for row in planned:
        peak = max(row["peak_inflight"])
        plan_rows.append([stages, 4 * stages, row["schedule"], row["placement"], row["chunks"], f"{row['step']:g}",
                          f"{row['bubble']:.3f}", f"{peak:.4g}", f"{row['peak_inflight'][0]:.4g}",
                          f"{row['weight_memory']:.4g}", max(row["messages"]), f"{seconds:.1f}"])
        by_schedule.setdefault(row["schedule"], []).append(f"{row['bubble']:.3f} | {peak:.4g}")
out.append(f"""## Planning at scale: tools/plan.py

Every schedule of `schedules.py` and the search, replayed at a stage's F : I : W = 1 : 2 : 1 with free
messages, m = 4n, sorted by step: the step in those units, the busiest rank's bubble, the largest rank's and rank
0's peak activations (micro-batches of a stage), at the share of a micro-batch that an I leaves for its W (plan.py's
default `--weight-memory`: this MLP's, 2L / (L + 1) at the default 16 layers' L blocks a stage, one at least), the
most tensors a rank sends, and the seconds plan.py took.

{ran()}

{table(["n", "m", "schedule", "placement", "chunks", "step", "bubble", "peak", "rank 0", "W's share", "messages",
        "plan.py (s)"], plan_rows)}""")
marked_tables["plan"] = "\n".join(
    ["| m = 4n, F : I : W = 1 : 2 : 1 | n = 8: bubble | peak | n = 32: bubble | peak | n = 64: bubble | peak |",
     "|---|---|---|---|---|---|---|"] + [f"| `{name}` | {' | '.join(cells)} |" for name, cells in by_schedule.items()])

# (2e) The planner against the published tables, pure replay: the zero-bubble paper's 12 settings (tools/paper.py),
# the search on the loop at its costs and memories p and 2p, judged by its measure; DualPipe's formula beside
# plan.py's replay of DualPipeV, at equal and uneven costs, with and without an overlap.
def planned_rows(*flags):
    """tools/plan.py --json's rows for these flags, by schedule, and the seconds it took; the command is shown."""
    command = [sys.executable, "tools/plan.py", *map(str, flags), "--json"]
    if len(commands) < 2:  # a section's first two commands stand for the rest, which differ in their settings
        commands.append(" ".join(["python", *command[1:]]))
    begin = time.time()
    lines = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    return {row["schedule"]: row for row in map(json.loads, lines)}, time.time() - begin


paper_rows, below = [], 0  # below: rows where the search at 2p is under the paper's ZB-2p
for row in paper.ROWS:
    found, seconds = {}, 0.0
    for times in (1, 2):
        found[times], took = planned_rows(
            "--stages", row.p, "--micro-batches", row.m, "--costs", f"{row.forward},{row.input_grad},{row.weight},"
            f"{row.message}", "--memory", times * row.p, "--weight-memory", repr(paper.weight_memory(row.h, row.a)),
            "--placement", "loop", "--virtual-stages", 1, "--objective", "window")
        seconds = max(seconds, took)
    rates = {times: round(found[times]["search"]["bubble_window"], 4) for times in (1, 2)}
    below += rates[2] < row.zb_2p
    paper_rows.append([row.p, row.m, row.h, f"{row.one_f_one_b:.4f}", f"{found[1]['1f1b']['bubble_window']:.4f}",
                       f"{row.zb_h1:.4f}", f"{found[1]['zb-h1']['bubble_window']:.4f}", f"{row.zb_1p:.4f}",
                       f"{rates[1]:.4f}", f"{row.zb_2p:.4f}", f"{rates[2]:.4f}", f"{seconds:.1f}"])
paper_table = table(["p", "m", "h", "1F1B: paper", "replay", "ZB-H1: paper", "replay", "ZB-1p: paper", "search, p",
                     "ZB-2p: paper", "search, 2p", "plan.py (s)"], paper_rows)
paper_line = (f"At memory 2p the search is below the paper's ZB-2p on {below} of the {len(paper.ROWS)} rows and "
              f"equal to it, to 4 decimals, on the rest.")
marked_tables["paper"] = "\n".join(
    ["| p, m, h | ZB-1p (paper) | search, memory p | ZB-2p (paper) | search, memory 2p |", "|---|---|---|---|---|"]
    + [f"| {p}, {m}, {h} | {cells[4]} | {cells[5]} | {cells[6]} | {cells[7]} |" for p, m, h, *cells in paper_rows]
    + ["", paper_line])
out.append(f"""## The planner against the zero-bubble paper

The paper's Table 9 settings (p stages, m micro-batches, its measured T_F, T_B (our I), T_W, T_comm in microseconds,
the model's h; `tools/paper.py`) replayed by tools/plan.py on the loop at one chunk a rank, each rate its bubble rate
(`bubble_window`: 1 - a rank's work over the longest rank's window), beside the paper's Table 5: 1F1B's and ZB-H1's
fixed tables, then the search at memory p and 2p micro-batches of M_B, an I leaving M_W / M_B = 32h / (34h + 5as)
(s = 1024) for its W, judged by the window (`--objective window`). {paper_line} The last column is plan.py's
longer run of the two. The commands are the first row's; the others differ in their settings.

{ran()}

{paper_table}""")

dualpipe_rows = []
for forward, input_grad, weight in ((1, 1, 1), (1, 2, 1), (1, 1, 2)):
    for overlap in (1, 0.75):
        for stages in (2, 4, 8):
            found, _ = planned_rows("--stages", stages, "--micro-batches", 4 * stages, "--costs",
                                    f"{2 * forward},{2 * input_grad},{2 * weight}", "--placement", "v",
                                    "--overlap", overlap)
            formula = (stages - 1) * (overlap * (forward + input_grad + weight) + input_grad + weight - 3 * weight)
            idle = found["dualpipev"]["window_idle"]
            dualpipe_rows.append([f"{forward} : {input_grad} : {weight}", f"{overlap:g}", stages, 4 * stages,
                                  f"{idle:g}", f"{formula:g}", f"{formula - idle:+g}"])
dualpipe_table = table(["a chunk's F : I : W", "overlap", "n", "m", "replay's idle", "DeepSeek's formula",
                        "formula - replay"], dualpipe_rows)
marked_tables["dualpipe"] = dualpipe_table
out.append(f"""## DualPipeV: DeepSeek's formula beside the replay

DeepSeek-V3's Table 2 gives DualPipe's bubble as (PP/2 - 1)(F&B + B - 3W), F a forward chunk, B a full backward
chunk (I + W), W its weight part and F&B an F and a B overlapped, here `--overlap` of the two; DualPipeV is DualPipe
on PP = 2n stages folded onto n ranks. Beside it, plan.py's `window_idle` of its `dualpipev` row: the most any rank
idles within its own window. A chunk is half a stage: `--costs` is twice a chunk's. The commands are the first two
of the table's; the others differ in their costs and overlap.

{ran()}

{dualpipe_table}""")

# (3) Speed: two ranks, the default size, the scripts and PyTorch's own schedules in turn, round by round.
SPEED_RUNS = [("03 1F1B", "03_1f1b.py", ""), ("04 interleaved, v = 2", "04_interleaved_1f1b.py", "--virtual-stages 2"),
              ("05 ZB-H1", "05_zero_bubble.py", ""), ("06 ZB-V", "06_zbv.py", ""),
              ("PyTorch `Schedule1F1B`", "tools/torch_schedules.py", "--schedule 1f1b"),
              ("PyTorch `ScheduleInterleaved1F1B`", "tools/torch_schedules.py", "--schedule interleaved-1f1b"),
              ("PyTorch `ScheduleZBVZeroBubble`", "tools/torch_schedules.py", "--schedule zbv")]
speed = [[run(script, 2, f"{SPEED} {SPEED_STEPS} {flags}") for _, script, flags in SPEED_RUNS]
         for _ in range(SPEED_ROUNDS)]
rows = []
for index, (name, script, _) in enumerate(SPEED_RUNS):
    runs, steps = [round_[index] for round_ in speed], [round_[index]["step_ms_median"] for round_ in speed]
    ratio = median([round_[index]["step_ms_median"] / round_[0]["step_ms_median"] for round_ in speed])
    row = [name, f"{median(steps):.1f}", f"{ratio:.3f}", per_rank(f"{step:.1f}" for step in steps)]
    if script == "tools/torch_schedules.py":  # its JSON line has the step time only
        rows.append(row + [""] * 6)
        continue
    busiest, at_costs = median([s["bubble_busiest"] for s in runs]), median([s["bubble_at_costs"] for s in runs])
    spans = " / ".join(f"{median([s['span_ms'][kind] for s in runs]):.2f}" for kind in runs[0]["span_ms"])
    early = [median([s["sends_before_receive"][rank] for s in runs]) / (runs[0]["steps"] - 1) for rank in (0, 1)]
    rows.append(row + [f"{busiest:.3f}", f"{runs[0]['bubble_theory']:.3f}", f"{at_costs:.3f}",
                       f"{busiest - at_costs:+.3f}", spans, per_rank((f"{e:.1f}" for e in early), " / ")])
out.append(f"""## Speed: two ranks, the default size

Rounds: {SPEED_ROUNDS}. In each round every row ran once, in the order of the table, so that a
slow minute of the machine falls on all of them. The step is the run's median step (the first step left
out), then the median over the rounds; the ratio is the median over the rounds of the step over
that round's 03. Bubbles are the busiest rank's, medians over the rounds; "at its costs" replays
the schedule's order at the run's own mean span times with free messages, and the excess over it
is what messages and shared cores cost. Spans are the mean F / B (I where it is split) / W, in ms.

{ran()}

{table(["", "step (ms)", "step / 03's", "each round (ms)", "busiest rank's bubble", "theory", "theory at its costs",
        "excess", "spans F / B or I / W (ms)", "sends before their receive, a step (rank 0 / 1)"], rows)}""")


def accounting_row(name, runs):
    """A script's mean step, the busiest rank's parts of it, its limit and its latency: medians over its runs."""
    parts = {part: median([s["step_parts_ms"][s["busiest_rank"]][part] for s in runs]) for part in runs[0][
        "step_parts_ms"][0]}
    step, limit = median([s["step_ms_mean"] for s in runs]), median([s["step_limit_ms"] for s in runs])
    return [name, f"{step:.1f}", *(f"{ms:.1f}" for ms in parts.values()), f"{limit:.1f}",
            f"{median([s['step_ms_mean'] / s['step_limit_ms'] for s in runs]):.3f}",
            f"{median([s['message_latency_ms'] for s in runs]):.3f}"]


rows = [accounting_row(name, [round_[index] for round_ in speed]) for index, (name, script, _) in enumerate(SPEED_RUNS)
        if script != "tools/torch_schedules.py"]  # PyTorch's runs have no spans: no accounting
header = ["2 ranks, the default size", "step (ms)", *speed[0][0]["step_parts_ms"][0], "limit (ms)", "step / limit",
          "message (ms)"]
marked_tables["accounting"] = table(header, [row for row in rows if row[0].startswith(("03", "06"))])  # README's
# every other script at the same size, in turn, round by round (01 has no micro-batches)
# and 06 on one rank, where no message leaves the rank: its runtime part is the helpers' and the meters' alone
OTHER_RUNS = [("01 naive", "01_naive.py", "", 2), ("02 GPipe", "02_gpipe.py", "", 2),
              ("07 pipelines side by side, D = 1", "07_pp_dp.py", "", 2), ("08 3D, D = T = 1", "08_3d.py", "", 2),
              ("09 `--schedule dualpipev`", "09_any_schedule.py", "--schedule dualpipev", 2),
              ("06 ZB-V on one rank (no messages)", "06_zbv.py", "", 1)]
unsplit = " ".join(word for pair in zip(SPEED.split()[::2], SPEED.split()[1::2]) if pair[0] != "--micro-batches"
                   for word in pair)
others = [[run(script, ranks, f"{unsplit if script == '01_naive.py' else SPEED} {SPEED_STEPS} {flags}")
           for _, script, flags, ranks in OTHER_RUNS] for _ in range(ACCOUNT_ROUNDS)]
rows += [accounting_row(name, [round_[index] for round_ in others]) for index, (name, *_) in enumerate(OTHER_RUNS)]
accounting = table(header, rows)
out.append(f"""### The same runs' steps in parts

Each script's mean step (`step_ms_mean`) and the busiest rank's parts of it (`step_parts_ms`), which add up to
it, beside the step's limit (`step_limit_ms`: this order replayed at its mean spans, each message at the latency
the run measured at start-up, plus the time between steps that no rank hides), medians over the rounds;
docs/reference.md, *A step in parts*, says what each part holds. 03-06 are the runs above; the others ran
after them, in turn, in {ACCOUNT_ROUNDS} rounds, the last of them on one rank (both of 06's chunks on it, so that no
message leaves it: its runtime part is the helpers' bookkeeping and the meters alone, for the same 48 computations
a step as each rank's at two ranks).

{ran()}

{accounting}""")

# Against PyTorch's runtime on equal terms: ours with --no-instrument (PyTorch's runs have no meters either), each
# pair one after the other, which of the two first alternating from round to round.
PYTORCH_PAIRS = [("GPipe", "02_gpipe.py", "gpipe"), ("1F1B", "03_1f1b.py", "1f1b"), ("ZB-V", "06_zbv.py", "zbv")]
rows = []
for name, script, schedule in PYTORCH_PAIRS:
    ratios, ours, theirs, cpu_ratios = [], [], [], []
    for round_ in range(PYTORCH_ROUNDS):
        pair = [(script, "--no-instrument"), ("tools/torch_schedules.py", f"--schedule {schedule}")]
        in_turn = pair if round_ % 2 == 0 else pair[::-1]
        summaries = {script_: run(script_, 2, f"{SPEED} {PYTORCH_STEPS} {flags}") for script_, flags in in_turn}
        mine, pytorchs = summaries[script], summaries["tools/torch_schedules.py"]
        ours.append(mine["step_ms_median"])
        theirs.append(pytorchs["step_ms_median"])
        ratios.append(ours[-1] / theirs[-1])
        cpu_ratios.append([a / b for a, b in zip(mine["step_cpu_ms"], pytorchs["step_cpu_ms"])])
    cpu = [median([round_[rank] for round_ in cpu_ratios]) for rank in range(2)]
    rows.append([f"{name}: `{script}`, PyTorch's `--schedule {schedule}`", f"{median(ours):.1f}",
                 f"{median(theirs):.1f}", f"{median(ratios):.3f}", per_rank(f"{ratio:.3f}" for ratio in ratios),
                 per_rank((f"{ratio:.3f}" for ratio in cpu), " / ")])
pytorch_table = table(["2 ranks, the default size", "ours, meters off (ms)", "PyTorch's (ms)", "ours / PyTorch's",
                       "each round", "CPU a step, ours / PyTorch's (rank 0 / 1)"], rows)
marked_tables["pytorch"] = pytorch_table
out.append(f"""### Against PyTorch's runtime, meters off

The step of the same schedule, ours with `--no-instrument` (no spans, no meters: PyTorch's runs have neither) and
PyTorch's, in {PYTORCH_ROUNDS} rounds, the two runs of a round one after the other, which of them first
alternating; the ratio is the median of the rounds' ratios. The CPU a step is each rank's process's (`step_cpu_ms`,
all its threads), ours over PyTorch's, the median of the rounds' ratios: the work each runtime does, wherever its
step waits. The meters' own cost is measured below.

{ran()}

{pytorch_table}""")

# (3b) --recompute's price in time: 03 on two ranks at the default size, without and with it, round by round.
if args.recompute_rounds:
    rounds = []
    for round_ in range(args.recompute_rounds):  # which of the two runs first alternates
        pair = {flag: run("03_1f1b.py", 2, f"{SPEED} {SPEED_STEPS} {flag}")
                for flag in ("", "--recompute")[::1 - 2 * (round_ % 2)]}
        rounds.append((pair[""], pair["--recompute"]))
    ratios = [recomputed["step_ms_median"] / plain["step_ms_median"] for plain, recomputed in rounds]
    ratio_sentence = (f"{median(ratios):.2f} of its step without, the median of {len(rounds)} alternating rounds at 2 "
                    f"ranks and the default size (from {min(ratios):.2f} to {max(ratios):.2f})")
    spans = lambda s: f"{s['span_ms']['forward']:.1f} / {s['span_ms']['full_backward']:.1f}"  # noqa: E731
    rows = [[number + 1, f"{plain['step_ms_median']:.1f}", f"{recomputed['step_ms_median']:.1f}", f"{ratio:.3f}",
             spans(plain), spans(recomputed)]
            for number, ((plain, recomputed), ratio) in enumerate(zip(rounds, ratios))]
    out.append(f"""## --recompute: the step's cost

03 on two ranks at the default size, without and with `--recompute`, in {len(rounds)} rounds, the
two runs of a round one after the other, which of them first alternating. A B with the flag runs
its forward again: per micro-batch F + B becomes 2F + B, about 4/3 of it when B takes twice F.
The step's ratio, with over without: median {median(ratios):.3f}, from {min(ratios):.3f} to
{max(ratios):.3f}. Steps are each run's median step (the first left out), in ms; spans the mean
forward / backward.

{ran()}

{table(["round", "step without (ms)", "step with (ms)", "with / without", "F / B without (ms)",
        "F / B with (ms)"], rows)}""")

# (4) The cost of measuring: --overhead instruments the even steps only.
rows = []
for _ in range(OVERHEAD_RUNS):
    s = run("03_1f1b.py", 2, f"{SPEED} {OVERHEAD_STEPS} --overhead")
    rows.append([f"{s['step_ms_median']:.1f}", f"{s['step_ms_median_bare']:.1f}",
                 f"{100 * (s['step_ms_median'] / s['step_ms_median_bare'] - 1):+.1f}%"])
out.append(f"""## The cost of measuring

03 on two ranks with `--overhead`, the even steps instrumented and the odd ones bare, the median
of each. Runs: {OVERHEAD_RUNS}.

{ran()}

{table(["instrumented (ms)", "bare (ms)", "instrumented over bare"], rows)}""")

# (4c) More micro-batches are not free: 03 and 06 at 2 ranks, the default batch cut into m = 1 to 16 micro-batches.
SWEEP_MS = (1, 2, 4, 8, 16) if not args.quick else (1, 2, 4)
SWEEP_RUNS = [("03", "03_1f1b.py"), ("06", "06_zbv.py")]
# plan.py's prediction: fitted on 05 traced in every round, beside the runs it predicts, at the sweep's fewest, a
# middle and its most micro-batches; 05 is traced at every m, for a block's time against its rows (the other m are
# the fit's check)
fitted_ms = (SWEEP_MS[0], SWEEP_MS[len(SWEEP_MS) // 2], SWEEP_MS[-1])
rows_traces = {m: [] for m in SWEEP_MS}  # each round's trace of 05 at m
sweep = []  # each round: {(name, m): summary}
for round_ in range(SWEEP_ROUNDS):  # which m runs first alternates
    sweep.append({})
    for m in SWEEP_MS[::1 - 2 * (round_ % 2)]:
        rows_traces[m].append(os.path.join(scratch, f"sweep_05_m{m}_r{round_}.json"))
        run("05_zero_bubble.py", 2, f"{unsplit} {SPEED_STEPS} --micro-batches {m} --trace {rows_traces[m][-1]}")
        sweep[-1].update({(name, m): run(script, 2, f"{unsplit} {SPEED_STEPS} --micro-batches {m}")
                          for name, script in SWEEP_RUNS})
sweep_traces = [path for m in fitted_ms for path in rows_traces[m]]
speed_flags = dict(zip(SPEED.split()[::2], SPEED.split()[1::2]))  # the default size, flag -> value
batch = int(speed_flags["--batch-size"])
planned = [sys.executable, "tools/plan.py", "--stages", "2", "--layers", speed_flags["--layers"], "--hidden",
           speed_flags["--hidden"], "--batch-size", str(batch), "--micro-batches", ",".join(map(str, SWEEP_MS)),
           "--costs-from", *sweep_traces, "--json"]
commands.append("python " + " ".join(planned[1:]).replace(os.path.join(scratch, ""), ""))
result = subprocess.run(planned, cwd=ROOT, capture_output=True, text=True)
if result.returncode:
    sys.exit(f"failed: {' '.join(planned)}\n{result.stderr}")
SWEEP_TABLES = {"03": "1f1b", "06": "zbv"}  # the table plan.py prices for each script of the sweep
predicted = {(row["schedule"], row["micro_batches"]): row["run_step"] / 1e3
             for row in map(json.loads, result.stdout.splitlines())
             if "run_step" in row and len(set(row["partition"])) == 1}  # each at the even split the script runs
sweep_rows = []
for m in SWEEP_MS:
    row = [m, batch // m]
    for name, _ in SWEEP_RUNS:
        runs = [round_[name, m] for round_ in sweep]
        compute = median([max(s["compute_ms"]) for s in runs])
        row += [f"{median([s['step_ms_mean'] for s in runs]):.1f}", f"{predicted[SWEEP_TABLES[name], m]:.1f}",
                f"{compute:.1f}", f"{median([s['bubble_busiest'] for s in runs]):.2f}",
                f"{runs[0]['bubble_theory']:.2f}"]
    sweep_rows.append(row)
sweep_header = ["m", "rows", *(f"{name} {column}" for name, _ in SWEEP_RUNS for column in (
    "step (ms)", "plan.py (ms)", "busiest compute (ms)", "bubble", "theory"))]
marked_tables["micro-batches"] = table(sweep_header, sweep_rows)


def sweep_picture(path, rows):
    """The step against m (log scale) for each script of the sweep, measured and as plan.py predicts it (dashed),
    and the busiest rank's bubble beside it (dashed: the theory's)."""
    left, width, height, gap = 60, 300, 200, 90
    steps = [float(cell) for row in rows for start in (2, 3) for cell in row[start::5]]
    top = max(steps) * 1.1
    x = lambda index: left + index * width / max(1, len(rows) - 1)  # noqa: E731
    colours = ["#4e79a7", "#e15759"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * (left + width) + gap}" height="{height + 70}" '
             'font-family="monospace" font-size="11"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{left}" y="14">step (ms) against m, 2 ranks, a batch of {batch} (dashed: plan.py)</text>',
             f'<text x="{2 * left + width + gap}" y="14">busiest rank\'s bubble (dashed: theory)</text>']
    for panel, (column, scale) in enumerate(((2, top), (5, 1.0))):
        shift = panel * (left + width + gap)
        parts.append(f'<line x1="{shift + left}" y1="{height + 30}" x2="{shift + left + width}" y2="{height + 30}" '
                     'stroke="black"/>')
        parts += [f'<text x="{shift + x(i) - 4}" y="{height + 46}">{row[0]}</text>' for i, row in enumerate(rows)]
        parts.append(f'<text x="{shift + 4}" y="{height + 34}">0</text><text x="{shift + 4}" y="34">{scale:.3g}</text>')
        lines = ((0, ""), (1, ' stroke-dasharray="4 3"'))  # plan.py's step, the bubble's theory: dashed
        for series, (name, _) in enumerate(SWEEP_RUNS):
            for offset, dash in lines:
                values = [float(row[column + offset + 5 * series]) for row in rows]
                points = " ".join(f"{shift + x(i):.1f},{30 + height * (1 - value / scale):.1f}"
                                  for i, value in enumerate(values))
                parts.append(f'<polyline points="{points}" fill="none" stroke="{colours[series]}"{dash}/>')
            parts.append(f'<text x="{shift + left + width - 30}" y="{40 + 14 * series}" fill="{colours[series]}">'
                         f'{name}</text>')
    with open(path, "w") as file:
        file.write("\n".join(parts + ["</svg>"]) + "\n")


sweep_picture(os.path.join(args.out, "docs", "img", "micro_batches.svg"), sweep_rows)

# A block's time a row against its rows: 05's traces at each m of the sweep, stage 0 (blocks, no head), each kind's
# mean span over its blocks and rows, beside what the fit on the traces above prices it at (the fit's forward at
# the runs' share of cold forwards), each the mean of the rounds'; the other m are not in the fit
with_rows = {}
for m, paths in rows_traces.items():
    with_rows[m] = []
    for path in paths:
        with open(path) as file:
            with_rows[m].append(json.load(file))
row_costs = fit.fit_rows([trace for m in fitted_ms for trace in with_rows[m]])
ROW_KINDS = {"forward": "F", "backward": "I", "weight": "W"}


def block_row(trace, kind):
    """A kind's mean span a block a row on stage 0 of one trace of 05, measured and as fitted (row_costs)."""
    blocks, size = trace["otherData"]["blocks"], statistics.mean(trace["otherData"]["rows"])
    measured_steps = set(trace["otherData"]["measured_steps"])
    spans = [event["dur"] for event in trace["traceEvents"] if event.get("ph") == "X" and event.get("cat") == kind
             and event["args"]["stage"] == 0 and event["args"]["step"] in measured_steps]
    fitted = row_costs.stage_costs(blocks, size)[0][kind] + \
        (kind == "forward") * row_costs.cold_forward * blocks[0] * fit.fit(trace).cold_share
    return statistics.mean(spans) / blocks[0] / size, fitted / blocks[0] / size


per_row = []  # m, rows, fitted on, then each kind's measured and fitted microseconds a block a row
for m, traces in with_rows.items():
    cells = [m, f"{statistics.mean(traces[0]['otherData']['rows']):g}", "yes" if m in fitted_ms else "no"]
    for kind in ROW_KINDS:
        measured, fitted = zip(*(block_row(trace, kind) for trace in traces))
        cells += [f"{statistics.mean(measured):.2f}", f"{statistics.mean(fitted):.2f}"]
    per_row.append(cells)
per_row_header = ["m", "rows", "in the fit", *(f"{name} {column}" for name in ROW_KINDS.values()
                                                for column in ("measured (µs)", "fitted (µs)"))]
marked_tables["rows"] = table(per_row_header, per_row)


def rows_picture(path, rows):
    """A block's time a row (µs) against a micro-batch's rows (log scale), each kind measured (dots: filled where
    the fit saw the run) and fitted (dashed)."""
    left, width, height = 60, 420, 200
    values = [float(cell) for row in rows for cell in row[3:]]
    top = max(values) * 1.1
    sizes = sorted(float(row[1]) for row in rows)
    span = math.log2(sizes[-1] / sizes[0]) or 1
    x = lambda size: left + width * math.log2(size / sizes[0]) / span  # noqa: E731
    y = lambda value: 30 + height * (1 - value / top)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 80}" height="{height + 70}" '
             'font-family="monospace" font-size="11"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{left}" y="14">a block\'s time a row (µs) against its rows, 05 on 2 ranks '
             '(dashed: fitted)</text>',
             f'<line x1="{left}" y1="{height + 30}" x2="{left + width}" y2="{height + 30}" stroke="black"/>',
             f'<text x="4" y="{height + 34}">0</text><text x="4" y="34">{top:.3g}</text>']
    parts += [f'<text x="{x(size) - 8:.1f}" y="{height + 46}">{size:g}</text>' for size in sizes]
    for index, (kind, name) in enumerate(ROW_KINDS.items()):
        colour = COLOURS[kind]
        ordered = sorted(rows, key=lambda row: float(row[1]))
        for offset, dash in ((0, ""), (1, ' stroke-dasharray="4 3"')):
            points = " ".join(f"{x(float(row[1])):.1f},{y(float(row[3 + 2 * index + offset])):.1f}" for row in ordered)
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}"{dash}/>')
        parts += [f'<circle cx="{x(float(row[1])):.1f}" cy="{y(float(row[3 + 2 * index])):.1f}" r="3" '
                  f'stroke="{colour}" fill="{colour if row[2] == "yes" else "white"}"/>' for row in ordered]
        parts.append(f'<text x="{left + width + 10}" y="{40 + 14 * index}" fill="{colour}">{name}</text>')
    with open(path, "w") as file:
        file.write("\n".join(parts + ["</svg>"]) + "\n")


rows_picture(os.path.join(args.out, "docs", "img", "rows.svg"), per_row)
out.append(f"""## More micro-batches: the step against m

03 and 06 at 2 ranks, the default model and batch cut into m micro-batches, in {SWEEP_ROUNDS} rounds (the order of m
alternating), medians over the rounds: the step (`step_ms_mean`, the run's period: a step's share of the run's time,
as plan.py's `run_step` prices it), plan.py's prediction (`run_step`, fitted on 05 traced in each round at
m = {", ".join(map(str, fitted_ms))}: a block's F, I and W against its rows), the busiest rank's
compute a step (`compute_ms`), its bubble (`bubble_busiest`) and the theory's. `docs/img/micro_batches.svg` draws it.

{ran()}

{table(sweep_header, sweep_rows)}

A block's time a row against a micro-batch's rows, from 05's traces at each m (stage 0: blocks, no head), each
kind's mean span over its blocks and rows (the mean of the rounds'), beside the fit on the runs at
m = {", ".join(map(str, fitted_ms))}
(`tools/fit.py`'s `fit_rows`, its forward at that run's share of cold forwards). `docs/img/rows.svg` draws it.
The fit's knees, below which a pass costs what it does at the knee: {", ".join(
    f"{name} {row_costs.knee[kind]:.3g} rows" for kind, name in ROW_KINDS.items())}.

{table(per_row_header, per_row)}""")

# (4d) What a pipeline buys: the baseline in one process, on one thread and on the pipelines' two cores, beside them.
BUYS_RUNS = [("00 one process, 1 thread", "00_baseline.py", 1, f"{unsplit} --threads 1"),
             ("00 one process, 2 threads", "00_baseline.py", 1, f"{unsplit} --threads 2"),
             ("03 1F1B, 2 ranks x 1 thread", "03_1f1b.py", 2, f"{SPEED} --threads 1"),
             ("06 ZB-V, 2 ranks x 1 thread", "06_zbv.py", 2, f"{SPEED} --threads 1")]
buys = [[run(script, ranks, f"{flags} {SPEED_STEPS}") for _, script, ranks, flags in BUYS_RUNS]
        for _ in range(SWEEP_ROUNDS)]
buys_rows = []
for index, (name, *_) in enumerate(BUYS_RUNS):
    steps = [round_[index]["step_ms_mean"] for round_ in buys]
    over = [[round_[index]["step_ms_mean"] / round_[base]["step_ms_mean"] for round_ in buys] for base in (0, 1)]
    buys_rows.append([name, f"{median(steps):.1f}", f"{median(over[0]):.2f}", f"{median(over[1]):.2f}"])
buys_header = ["the default model and batch", "step (ms)", "over one thread", "over one process on the same cores"]
marked_tables["buys"] = table(buys_header, buys_rows)
out.append(f"""## What a pipeline buys

The baseline in one process, on one thread and on two (the cores two ranks of one thread use), beside 03 and 06
on those two cores (m = {speed_flags['--micro-batches']}), in {SWEEP_ROUNDS} rounds, each row once a round in this
order: the step is `step_ms_mean`, the run's period; the ratios are medians over the rounds of a row's step over
that round's baseline.

{ran()}

{table(buys_header, buys_rows)}""")

# (5) The default run: the README's first command.
s = run("03_1f1b.py", 2, DEFAULT)
out.append(f"""## The default run

{ran()}

Once: the loss went from {s['losses'][0]:.2f} at the first step to {statistics.mean(s['losses'][-5:]):.3f}
on average over the last five of {len(s['losses'])}; the busiest rank's bubble was
{s['bubble_busiest']:.3f} (theory {s['bubble_theory']:.3f}); the run took {s['wall_s']:.1f} s, start-up included.""")

# (6) 07's all-reduce: 2 stages x 2 copies against 03 on one copy's share, paced, round by round.
rows = []
for m in (4, 8):
    share = 5 if m == 4 else m  # samples a pipeline
    excess, first, last, hidden, hops = [], [], [], [], []
    for round_ in range(PP_DP_ROUNDS):
        traces = [os.path.join(scratch, f"{name}-m{m}.trace.json") for name in ("07", "03")]
        pp_dp = run("07_pp_dp.py", 4, f"{PP_DP} --micro-batches {m} --batch-size {2 * share} --data-parallel 2 "
                                      f"--trace {traces[0]}")
        alone = run("03_1f1b.py", 2, f"{PP_DP} --micro-batches {m} --batch-size {share} --trace {traces[1]}")
        reduce_ms = pp_dp["allreduce_ms"]
        excess.append(pp_dp["step_ms_median"] - alone["step_ms_median"])
        first.append(max(reduce_ms[0], reduce_ms[2]))  # stage 0's copies are ranks 0 and 2, stage 1's 1 and 3
        last.append(max(reduce_ms[1], reduce_ms[3]))
        hidden.append(all(pp_dp["allreduce_hidden_ms"][r] >= 0.99 * reduce_ms[r] for r in (1, 3)))
        hops.append((gradient_hop(traces[0], 1, 0), gradient_hop(traces[1], 1, 0)))  # pipeline 0: ranks 1 -> 0
    spread = lambda values: f"{median(values):.1f} ({min(values):.1f} to {max(values):.1f})"  # noqa: E731
    rows.append([m, spread(excess), spread(first), f"{median(last):.1f}",
                 f"{sum(e <= f for e, f in zip(excess, first))} of {len(excess)}", f"{sum(hidden)} of {len(hidden)}",
                 f"{median([hop[0] for hop in hops]):.2f} / {median([hop[1] for hop in hops]):.2f}"])
out.append(f"""## 07: the all-reduce against the step

Rounds: {PP_DP_ROUNDS} at each micro-batch count. In each, 07 with 2 stages x 2 copies (a
pipeline's share: 5 samples at m = 4, m at m = 8), then 03 on 2 ranks with one copy's share. A
stage's all-reduce is the longer of its two copies' (ms a step, medians over the rounds); the last
stage's is hidden when all of it lies within its pipeline's span. The gradient's hop is the median
time from the end of stage 1's backward to the start of stage 0's backward of the same
micro-batch, in the traces.

{ran()}

{table(["m", "07's step over 03's, median (range) ms", "first stage's all-reduce, median (range) ms",
        "last stage's all-reduce (ms)", "rounds within the first stage's sum", "rounds with the last stage's hidden",
        "gradient's hop, 07 / 03 (ms)"], rows)}""")

# (7) 08's bytes a step, from its paced run in (1): exact, whatever the timing, beside docs/design.md's formulas.
s, (layers, hidden, batch) = paced["08_3d"], (int(value) for value in PACED.split()[1:6:2])
stages, shards, m, element = s["world_size"] // s["tensor_parallel"], s["tensor_parallel"], s["num_microbatches"], 4
rows = []
for rank in range(s["world_size"]):
    stage = rank // shards % stages
    blocks = layers // stages + (stage < layers % stages)
    collectives = 2 * ((blocks + 1) // 2) - (stage == 0)  # each pair's and odd block's, forward and backward
    sent = batch * hidden * element * ((stage > 0) + (stage < stages - 1))  # the whole activation and gradient
    rows.append([rank, stage, rank % shards, f"{s['sent_bytes'][rank]} / {sent}",
                 f"{s['tp_allreduces'][rank]} / {m * collectives}",
                 f"{s['tp_allreduce_bytes'][rank]} / {batch * hidden * element * collectives}",
                 f"{s['tp_allreduce_ms'][rank]:.1f}",
                 f"{s['parameter_bytes'][rank]} / {s['expected_parameter_bytes'][rank]}"])
out.append(f"""## 08: the bytes of the third axis

08's paced run in "Paced: each schedule alone" (2 stages x 2 shards, float32, a batch of {batch} rows of width
{hidden}): per rank and step, the bytes it sent to the next and the previous stage (each shard sends the whole
activation and the whole gradient), the shards' all-reduces and gathers and the bytes of the tensors they
made, the ms spent in them (within the padded F and B), and the rank's parameter bytes, each measured / the
formula of docs/design.md, *Tensor parallelism inside each stage*.

{table(["rank", "stage", "shard", "sent (bytes)", "TP collectives", "TP bytes", "TP ms", "parameter bytes"], rows)}""")

# (8) Stages that cost what they hold: a heavy head on 2 ranks, --partition even against balanced, round by round,
# beside tools/plan.py's predicted ratio at the same counted costs.
HEAVY_RUNS = [("03_1f1b.py", "", "1f1b"), ("05_zero_bubble.py", "", "zb-h1"),
              ("09_any_schedule.py", "--schedule dualpipev", "dualpipev")]
model = HEAVY.split()
model_flags = {flag: int(value) for flag, value in zip(model[::2], model[1::2])}
command = [sys.executable, "tools/plan.py", "--stages", "2", "--micro-batches", str(model_flags["--micro-batches"]),
           *model[:6], "--json"]
planned = [json.loads(line) for line in subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                                       check=True).stdout.splitlines()]
rows = []
for script, flags, name in HEAVY_RUNS:
    rounds = []
    for round_ in range(HEAVY_ROUNDS):  # which of the two runs first alternates
        pair = {split: run(script, 2, f"{HEAVY} {flags} --partition {split}")
                for split in ("even", "balanced")[::1 - 2 * (round_ % 2)]}
        rounds.append((pair["even"], pair["balanced"]))
    even, balanced = rounds[0]
    steps = {split: [{"even": a, "balanced": b}[split]["step_ms_median"] for a, b in rounds]
             for split in ("even", "balanced")}
    measured = median([b["step_ms_median"] / a["step_ms_median"] for a, b in rounds])
    mine = {tuple(row["partition"]): row["step"] for row in planned if row["schedule"] == name}
    predicted = mine[tuple(balanced["blocks"])] / mine[tuple(even["blocks"])]
    rows.append([f"`{script[:-3]}{' ' + flags if flags else ''}`", ",".join(map(str, even["blocks"])),
                 ",".join(map(str, balanced["blocks"])), f"{median(steps['even']):.0f}",
                 f"{median(steps['balanced']):.0f}", f"{measured:.3f}", f"{predicted:.3f}",
                 f"{measured / predicted - 1:+.1%}", per_rank(f"{b / a:.3f}" for a, b in zip(*steps.values()))])
heavy_table = table(["2 ranks", "even", "balanced", "step even (ms)", "step balanced (ms)", "balanced / even",
                     "plan.py's", "measured over predicted", "each round"], rows)
marked_tables["partition"] = heavy_table
out.append(f"""## Stages that cost what they hold: a heavy head

On two ranks, `{HEAVY}`: the head is a {model_flags['--hidden']} x {model_flags['--classes']} matrix,
{model_flags['--classes'] / model_flags['--hidden']:g} blocks' worth. Each script ran with `--partition even` and
`--partition balanced` in {HEAVY_ROUNDS} rounds, the two one after the other, which first alternating, in real
arithmetic (no --pace). Steps are each run's median step (the first left out), then the median over the rounds;
the ratio is the median of each round's. plan.py's is its replay at the counted costs, balanced over even
(`{' '.join(command[1:])}`).

{ran()}

{heavy_table}""")

# (9) A real step predicted: tools/plan.py --costs-from one run of 05, each schedule's run column against its own
# runs, round by round, at 2 ranks.
PREDICT_RUNS = [("1f1b", "03_1f1b.py", ""), ("interleaved-1f1b", "04_interleaved_1f1b.py", ""),
                ("zb-h1", "05_zero_bubble.py", ""), ("zbv", "06_zbv.py", ""),
                *((name, "09_any_schedule.py", f"--schedule {name}")
                  for name in ("dualpipev", "interleaved-zero-bubble", "looped-bfs"))]
traces = [os.path.join(scratch, f"predict-05-{round_}.json") for round_ in range(PREDICT_ROUNDS)]
model = dict(zip(PREDICT.split()[::2], PREDICT.split()[1::2]))


def chunked(name):
    """Whether the schedule's table puts more than one chunk on a rank."""
    return any(chunk for table in schedules.table(name, 2, int(model["--micro-batches"])) for _, chunk, _ in table)


def predict_trace(name, round_):
    """The --trace of a prediction run: 05's, which plan.py is fitted on, and each chunked schedule's."""
    if name == "zb-h1":
        return traces[round_]
    return os.path.join(scratch, f"predict-{name}-{round_}.json") if chunked(name) else None


def predict_flags(name, flags, round_):
    trace = predict_trace(name, round_)
    return f"{PREDICT} {flags}" + (f" --trace {trace}" if trace else "")


predict_rounds = [[run(script, 2, predict_flags(name, flags, round_)) for name, script, flags in PREDICT_RUNS]
                  for round_ in range(PREDICT_ROUNDS)]


def forwards_after(trace_paths):
    """Mean forward span (ms) on a rank right after a computation of the same chunk and right after one of its other
    chunk, and how many forwards follow the other chunk, over these traces' measured steps."""
    after = {True: [], False: []}  # the previous computation's chunk is the same: forward spans
    for path in trace_paths:
        with open(path) as file:
            trace = json.load(file)
        measured = set(trace["otherData"]["measured_steps"])
        computations = sorted((event for event in trace["traceEvents"] if event.get("ph") == "X"
                               and event.get("cat") in COMPUTE and event["args"].get("step") in measured),
                              key=lambda event: (event["pid"], event["ts"]))
        for previous, event in zip(computations, computations[1:]):
            if event["cat"] == "forward" and previous["pid"] == event["pid"] and \
                    previous["args"]["step"] == event["args"]["step"]:
                after[previous["args"]["chunk"] == event["args"]["chunk"]].append(event["dur"] / 1e3)
    same, other = (statistics.mean(after[kind]) if after[kind] else math.nan for kind in (True, False))
    return same, other, len(after[False]) / (len(after[True]) + len(after[False]))


# the trace of 05's middle run: the machine's speed drifts between rounds, and one run is fitted
steps_05 = [round_[2]["step_ms_mean"] for round_ in predict_rounds]
fitted_round = sorted(range(PREDICT_ROUNDS), key=steps_05.__getitem__)[PREDICT_ROUNDS // 2]
fitted_on = os.path.join(scratch, "predict-05.json")
shutil.copyfile(traces[fitted_round], fitted_on)
with open(fitted_on) as file:
    fitted_trace = json.load(file)
prices = fit.fit(fitted_trace)
command = [sys.executable, "tools/plan.py", "--stages", "2", "--micro-batches", model["--micro-batches"],
           "--layers", model["--layers"], "--hidden", model["--hidden"], "--costs-from", fitted_on, "--json"]
even = [int(model["--layers"]) // 2] * 2
planned = {row["schedule"]: row for row in map(json.loads, subprocess.run(
    command, cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines())
    if row.get("partition") in (even, [int(model["--layers"]) // 4] * 4)}
shown_command = " ".join(command[1:]).replace(os.path.join(scratch, ""), "")
measured_steps = {name: median([round_[index]["step_ms_mean"] for round_ in predict_rounds])
                  for index, (name, _, _) in enumerate(PREDICT_RUNS)}
rows = []
for index, (name, script, flags) in enumerate(PREDICT_RUNS):
    step, predicted = measured_steps[name], planned[name]["run_step"] / 1e3
    rows.append([f"`{script[:-3]}{' ' + flags if flags else ''}`", f"{step:.1f}", f"{predicted:.1f}",
                 f"{predicted / step - 1:+.1%}", "yes" if abs(predicted / step - 1) <= 0.10 else "**no**",
                 f"{planned[name]['step'] / 1e3:.1f}",
                 per_rank(f"{round_[index]['step_ms_mean']:.1f}" for round_ in predict_rounds)])
pairs = [(a, b) for a in measured_steps for b in measured_steps if measured_steps[a] > 1.05 * measured_steps[b]]
agreed = [(a, b) for a, b in pairs if planned[a]["run_step"] > planned[b]["run_step"]]
swapped = ", ".join(f"{a} over {b}" for a, b in pairs if (a, b) not in agreed) or "none"
switch_rows = []
for name, script, flags in PREDICT_RUNS:
    if chunked(name):
        same, other, share = forwards_after([predict_trace(name, round_) for round_ in range(PREDICT_ROUNDS)])
        switch_rows.append([f"`{script[:-3]}{' ' + flags if flags else ''}`", f"{share:.0%}", f"{same:.3f}",
                            f"{other:.3f}", f"{other / same:.2f}"])
predict_table = table(["2 ranks", "measured step (ms)", "plan.py's run (ms)", "off by", "within 10%",
                       "plan.py's step, free messages and runtime (ms)", "each round (ms)"], rows) + f"""

Of the {len(pairs)} pairs whose measured steps differ by more than 5%, plan.py orders {len(agreed)} as the runs do
(the others, the slower first: {swapped}).

In the same runs, a forward right after a computation of the same chunk and right after one of the rank's other
chunk, whose weights the cache may no longer hold (05, one stage a rank, has only the first kind; plan.py prices
the second as it prices a forward after a W):

""" + table(["2 ranks, all rounds", "forwards after the other chunk", "forward after the same chunk (ms)",
             "after the other chunk (ms)", "other / same"], switch_rows)
marked_tables["predict"] = predict_table
out.append(f"""## A real step predicted: plan.py fitted on one run of 05

At `{PREDICT}` on two ranks: every schedule's script in {PREDICT_ROUNDS} rounds, in turn, 05 with `--trace`;
the measured step is each run's mean step (`step_ms_mean`, steps back to back), the median over the rounds.
plan.py's run column (`run_step`) replays each table at the stages' F, I and W fitted on the trace of 05's middle
run (round {fitted_round + 1}, {steps_05[fitted_round]:.1f} ms), each computation and message costing what the
runtime spent around 05's, each message the hand-over 05's waits show, a full backward as its script runs it, plus
each rank's time between steps (`{shown_command}`, the even split's rows). The prices fitted (tools/fit.py): a
message's hand-over {prices.latency / 1e3:.3f} ms (the ping-pong at start-up measured
{fitted_trace["otherData"]["message_latency_ms"]:.3f} ms), the runtime
{prices.per_computation / 1e3:.3f} ms a computation and {prices.per_message / 1e3:.3f} ms a message it posts, and a
forward whose weights have left the cache {prices.cold_forward / 1e3:.3f} ms more a block ({prices.cold_share:.0%} of
05's forwards were such).

{ran()}

{predict_table}""")

# The machine, the code, the date: what every figure above depends on.
with open("/proc/cpuinfo") as file:
    cpu = next((line.split(":", 1)[1].strip() for line in file if line.startswith("model name")), "unknown")
minutes = (time.time() - started) / 60
quick = "\n\n**A rehearsal (`--quick`): the smallest sizes, one round. These numbers mean nothing.**" * args.quick
header = f"""# Measured

Written by `python tools/measure.py{' --quick' * args.quick}`, which reruns every figure the README and
docs/ cite.{quick}

- machine: {len(os.sched_getaffinity(0))} cores, {cpu}
- torch {importlib.metadata.version('torch')}, gloo, CPU
- code: commit {commit or 'unknown'}{dirty}
- date: {datetime.datetime.now():%Y-%m-%d %H:%M}; every run alone, one after another, {minutes:.1f} min in all

Step times on shared cores vary from run to run (see each round's below): compare figures within
this file, and medians rather than single runs. In-flight counts and bytes are exact."""
with open(os.path.join(args.out, "docs", "measured.md"), "w") as file:
    file.write("\n\n".join([header] + out) + "\n")
marked_tables["recompute"] = "\n".join(
    ["| 4 ranks, m = 8, 16 layers: held, ranks 0-3 | without | with `--recompute` |", "|---|---|---|"]
    + [f"| {name} | {held['off']} | {held['on']} |" for name, held in held_by_flag.items()]
    + ["", f"03's step with `--recompute` costs {ratio_sentence}." if args.recompute_rounds else ""])
if not args.quick:  # each file's tables of MARKED, each between its two markers
    for path, names in MARKED.items():
        text = open(os.path.join(ROOT, path)).read()
        for name in names:
            begin, end = f"<!-- from measure.py: {name} -->\n", f"<!-- end of measure.py's {name} -->"
            text = text[:text.index(begin) + len(begin)] + marked_tables[name] + "\n" + text[text.index(end):]
        with open(os.path.join(args.out, path), "w") as file:
            file.write(text)
print(f"wrote {os.path.join(args.out, 'docs', 'measured.md')} and {os.path.join(args.out, 'docs', 'img')} "
      f"in {minutes:.1f} min")
