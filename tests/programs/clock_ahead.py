"""Run by test_measurements: rank 1 poses as another machine, its clock 1000 s ahead; each rank writes its offset."""
import os
import time

import common
import harness

if os.environ["RANK"] == "1":
    harness.startup._machine_id = lambda: "another machine"
    perf_counter = time.perf_counter
    time.perf_counter = lambda: perf_counter() + 1000.0
common.setup(common.parse_args("clocks"))
with open(os.path.join(os.environ["OFFSET_FOLDER"], "offset" + os.environ["RANK"]), "w") as file:
    file.write(repr(harness.meters.recorder.offset))
common.finish()
