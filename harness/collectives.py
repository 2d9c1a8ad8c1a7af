"""The spans of 07's and 08's collectives: a layer around torch's dist.all_reduce and dist.all_gather, which
after_setup installs (install), as guarantees.py wraps the point-to-point calls, so that the scripts call torch's
own. A call on a stage's shards (08's mesh["tp"]) is a TP span, any other an "allreduce" (a stage's gradients
summed over its copies, 07 and 08). Requests started one after another on a group and waited for later (the
gradients', a tensor each) are one span, from the first start to the last wait; a failed wait is one sentence
naming whom it waited for."""

import torch.distributed as dist

from harness.flags import gave_up
from harness.meters import TP, Span, mark, recorder

_torch = {}  # torch's own calls, once installed: name -> function
_device_mesh = None  # common.device_mesh: the mesh 07 and 08 build (None before, and in the other scripts)
_open = {}  # group -> the _Batch of its requests started and not yet all waited for


def install(device_mesh):
    """Wrap dist.all_reduce and dist.all_gather; device_mesh() gives the mesh whose "tp" group is 08's shards."""
    global _device_mesh
    _device_mesh = device_mesh
    for name in ("all_reduce", "all_gather"):
        if name not in _torch:
            _torch[name] = getattr(dist, name)
            setattr(dist, name, _timed(name))


def torch_call(name):
    """torch's own dist.<name>, for the harness's own collectives (08's dumps join the shards: no part of a step)."""
    return _torch.get(name) or getattr(dist, name)


class _Batch:
    """Requests started together on one group: one span, from the first start to the last wait."""

    def __init__(self, kind):
        self.kind, self.begun, self.nbytes, self.started, self.waited = kind, _now(), 0, 0, 0


class _Request:
    """What an asynchronous call returns: torch's request, whose wait() ends the batch's span with the last."""

    def __init__(self, request, batch):
        self.request, self.batch = request, batch

    def wait(self):
        _wait(self.request.wait, self.batch.kind)
        self.batch.waited += 1
        if self.batch.waited == self.batch.started:
            _record(self.batch.kind, self.batch.begun, self.batch.nbytes)
        return True

    def is_completed(self):
        return self.request.is_completed()


def _timed(name):
    def call(tensor, *args, group=None, async_op=False, **kwargs):
        kind = _kind(group)
        nbytes = tensor.nbytes if name == "all_reduce" else args[0].nbytes * len(tensor)  # what it makes
        if not async_op:
            begun = _now()
            _wait(lambda: _torch[name](tensor, *args, group=group, **kwargs), kind)
            _record(kind, begun, nbytes)
            return None
        if group not in _open or _open[group].waited:  # the open batch is being waited for: a new one
            _open[group] = _Batch(kind)
        batch = _open[group]
        batch.started += 1
        batch.nbytes += nbytes
        return _Request(_torch[name](tensor, *args, group=group, async_op=True, **kwargs), batch)

    call.__doc__ = f"torch's dist.{name}, its span recorded (harness/collectives.py)"
    return call


def _kind(group):
    mesh = _device_mesh() if _device_mesh else None
    is_shards = mesh is not None and "tp" in mesh.mesh_dim_names and group is mesh.get_group("tp")
    return TP if is_shards else "allreduce"


def _wait(wait, kind):
    try:
        wait()
    except RuntimeError as error:
        peers = "its copies" if kind == "allreduce" else "the other shards of its stage"
        raise gave_up(kind, peers, error, "one") from None


def _now():
    return mark() if recorder.enabled else None


def _record(kind, begun, nbytes):
    if recorder.enabled and begun is not None:
        recorder.pending.append(Span(recorder.step, kind, 0, 0, begun, mark(), nbytes))
