"""Put into a script by variant: at each post, and at each module's forward (inside a computation), note the
scheduling policy of every gloo socket thread of this rank, found apart from harness/transport.py; before the
report, print how many notes found SCHED_BATCH at the posts and SCHED_OTHER in the computations."""
import os

import torch

import common
import harness

notes = {"post": [], "computing": []}  # (where) -> each thread's policy, one list a note


def socket_threads():
    threads = []
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/comm") as file:
                if file.read().strip() == "gloo_tcp_loop":
                    threads.append(int(thread))
        except OSError:
            pass
    return threads


def note(where):
    notes[where].append([os.sched_getscheduler(thread) for thread in socket_threads()])


def post(*operations):
    note("post")
    return _post(*operations)


def report(*args, **kwargs):
    batch = sum(all(policy == os.SCHED_BATCH for policy in policies) for policies in notes["post"])
    other = sum(all(policy == os.SCHED_OTHER for policy in policies) for policies in notes["computing"])
    threads = min(len(policies) for policies in notes["post"] + notes["computing"])
    print(f"socket threads {threads} posts {batch}/{len(notes['post'])} computing {other}/{len(notes['computing'])}",
          flush=True)
    return _report(*args, **kwargs)


_post, common.post = common.post, post
torch.nn.modules.module.register_module_forward_pre_hook(lambda module, inputs: note("computing"))
_report, harness.report = harness.report, report
