"""Started once by tests/launch.py: forks each rank asked for on stdin from a process that has imported torch."""
import json
import os
import runpy
import select
import sys

import torch._dynamo  # noqa: F401
import torch.distributed  # noqa: F401
import torch.nn.functional  # noqa: F401

running = {}  # pid -> the file its exit code goes to
while True:
    if select.select([sys.stdin], [], [], 0.02)[0]:
        request = sys.stdin.readline()
        if not request:
            break
        request = json.loads(request)
        pid = os.fork()
        if pid == 0:
            os.environ.clear()
            os.environ.update(request["env"])
            for fd, path in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC if fd else os.O_RDONLY), fd)
            os.chdir(request["cwd"])
            sys.argv, sys.path[0] = request["argv"], os.path.dirname(os.path.abspath(request["argv"][0]))
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
            except BaseException:
                sys.excepthook(*sys.exc_info())
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        running[pid] = request["exit"]
        print(pid, flush=True)
    while running and (ended := os.waitpid(-1, os.WNOHANG))[0]:
        exit_file = running.pop(ended[0])
        with open(exit_file + ".tmp", "w") as file:
            file.write(str(os.waitstatus_to_exitcode(ended[1])))
        os.replace(exit_file + ".tmp", exit_file)  # whole, or not there
for pid in running:  # the session is over: no rank outlives it
    os.kill(pid, 9)
