"""Everything around the lesson, which a reader can skip. The numbered scripts call it with one line
at each call site: `with record("forward", i):`, `with timed_step(step):`, `log_step(step, loss)`,
`report(args, stages, expected_inflight)`.

flags.py     what each flag means, the harness's own flags, their checks, and ending a run with one sentence
startup.py   cores and threads, errors as sentences, the same flags and one clock on every rank, a message's
             latency; --dump-grads and --dump-params
meters.py    what each rank measures as it runs: bytes held, spans, step times, when sends and receives are posted
guarantees.py the rules around torch's sends and receives: held bytes, NCCL's rules under --sync-sends, a failed
             wait as one sentence
collectives.py the spans of 07's and 08's all-reduces and gathers, around torch's calls
transport.py gloo's socket threads take the rank's core when they wake only while it computes
summary.py   report: every rank's records on rank 0, the summary, its comparison with theory, each rank's step
             in parts beside the step's limit, the table
pictures.py  the last step as text and as an SVG, and every span as a Chrome trace
layout.py    the flags checked against the layout (09's table too); once the pipeline is known, each stage's blocks
             as --partition says, --pace's spans by their cost
"""

from harness.flags import PipelineError, fail, gave_up
from harness.layout import add_flags, plan_stages
from harness.meters import log_step, pace_share, record, timed_step, track
from harness.startup import after_setup, before_setup, dump
from harness.summary import report

__all__ = ["PipelineError", "add_flags", "after_setup", "before_setup", "dump", "fail", "gave_up",
           "log_step", "pace_share", "plan_stages", "record", "report", "timed_step", "track"]
