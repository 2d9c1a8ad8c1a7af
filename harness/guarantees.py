"""The rules that keep the point-to-point helpers' promises: a layer around torch's own calls, which after_setup
installs (install) and common.py never names. The lesson posts each group with dist.batch_isend_irecv and waits
for the request that covers each operation; here that call is wrapped, and each request the lesson waits for is a
message's, waited for as its rule says. tests/test_guarantees.py and tests/test_one_request.py break each rule
through its name; test_one_request.py also runs the lesson with the layer not installed.

release_on_arrival  a send is let go once a tensor from its peer proves it arrived (test_release_on_arrival)
hold_back    --sync-sends runs a rank's groups one after another, as NCCL does (test_sync_sends_catches_a_*)
wire_tag     --sync-sends matches receives by order alone, as NCCL does (test_guarantees.py::test_wire_tag)
one_request  --sync-sends answers a group with one request, as NCCL does (test_one_request.py, under --sync-sends)
wait         a failed wait is one sentence naming the rank waited for (test_stuck_rank_times_out)
"""

import dataclasses

import torch.distributed as dist

from harness.flags import gave_up
from harness.meters import posted as note_posted
from harness.meters import record, track

sync_sends = False  # --sync-sends: NCCL's rules on gloo
num_chunks = 1  # model chunks per rank, named in a failed wait's sentence when more than one
in_transit = {}  # (peer, tag) -> Message: sends posted and not yet let go
groups = 0  # groups posted so far
unwaited = []  # receives (Messages) posted and not yet waited for
_post = None  # torch's own dist.batch_isend_irecv, once installed
_named = None  # common.named: what a tag names, seen from this rank
_covering = None  # common.covering: each operation's request, its own or its group's


@dataclasses.dataclass(eq=False)
class Message:
    """A tensor sent or received: its peer (a rank of the world), its tag, its buffer, and the request that
    covers it once posted."""
    peer: int
    tag: int
    tensor: object
    is_send: bool
    request: object = None
    group: int = 0  # the count of groups posted before its own

    def wait(self):
        """What the lesson waits for (one request a message): a receive arrives (arrive), a send is let go once
        received (release)."""
        if self.is_send:
            release(self.peer, self.tag)
        else:
            arrive(self)
        return True


def install(args, named, covering):
    """Wrap dist.batch_isend_irecv with the rules, for this run's flags. The lesson's own readings: named(tag,
    sending), what one of this rank's tags names, (micro_batch, chunk, is_gradient), for the spans and the
    sentences; covering(requests, count), each of a group's operations' request, as the backend answered."""
    global sync_sends, num_chunks, _post, _named, _covering
    sync_sends, num_chunks, _named, _covering = args.sync_sends, args.virtual_stages, named, covering
    if _post is None:
        _post, dist.batch_isend_irecv = dist.batch_isend_irecv, batch_isend_irecv


def uninstall():
    """torch's own call again, for a runtime that posts its own groups (tools/torch_schedules.py: PyTorch's)."""
    global _post
    if _post is not None:
        dist.batch_isend_irecv, _post = _post, None


def batch_isend_irecv(operations):
    """torch's, under the rules: one request a message, each waited for as its rule says."""
    hold_back()
    messages = [Message(op.peer, op.tag, track(op.tensor), op.op is dist.isend) for op in operations]
    on_the_wire = [dist.P2POp(op.op, op.tensor, op.peer, group=op.group, tag=wire_tag(op.tag)) for op in operations]
    posted(messages, _post(on_the_wire))
    return messages


def posted(messages, requests):
    """Note a group's sends (in transit until let go) and receives (to wait for), and tell the meters."""
    global groups
    note_posted(messages)
    # the lesson's rule: a message whose request it misses stops the run here, not with an unfilled buffer later
    for message, request in zip(messages, _covering(one_request(requests), len(messages)), strict=True):
        message.request = request
        message.group = groups
        if message.is_send:
            in_transit[message.peer, message.tag] = message
        else:
            unwaited.append(message)
    groups += 1


def one_request(requests):
    """--sync-sends: NCCL answers a group with one request, done when all of the group is; gloo gives one each."""
    return [Group(requests)] if sync_sends and len(requests) > 1 else requests


class Group:
    """--sync-sends' one request for a group: done once all of it is, waited for once, whichever message asks."""

    def __init__(self, requests):
        self.requests = list(requests)

    def wait(self):
        while self.requests:
            self.requests[0].wait()
            self.requests.pop(0)  # waited: the request (and the tensor it holds) is let go
        return True


def release_on_arrival(arrival):
    """Every rank posts its half of each exchange in the same order (as NCCL needs), so the peer sent this
    tensor after posting its receive of all we sent it up to the group that receives this: let go of those."""
    for peer, tag in [(peer, tag) for (peer, tag), message in in_transit.items()
                      if peer == arrival.peer and message.group <= arrival.group]:
        release(peer, tag)


def hold_back():
    """--sync-sends: NCCL runs a rank's groups one after another, each done once its sends are received
    and its receives have arrived: what was posted earlier holds back the group about to be posted."""
    while sync_sends and unwaited:
        wait(unwaited.pop(0))
    while sync_sends and in_transit:
        release(*next(iter(in_transit)))


def wire_tag(tag):
    """--sync-sends: NCCL ignores tags and matches by order alone; a schedule posting in the wrong order
    then fails the gradient check on gloo too."""
    return 0 if sync_sends else tag


def arrive(message):
    """Wait for a posted receive, once; the sends it proves received are let go of."""
    if message in unwaited:  # unless a later group has waited for it already (hold_back)
        unwaited.remove(message)
        wait(message)
    release_on_arrival(message)


def release(peer, tag):
    """Wait until the peer has the tensor sent with this tag, and let go of it, which frees its buffer."""
    if (peer, tag) in in_transit:
        wait(in_transit.pop((peer, tag)))


def wait(message):
    micro_batch, chunk, is_gradient = _named(message.tag, message.is_send)
    try:
        with record("wait", micro_batch, chunk):
            message.request.wait()  # no timeout here: on NCCL a timed wait blocks the host; --timeout bounds it
    except RuntimeError as error:
        what = f"{'send' if message.is_send else 'recv'}_{'backward' if is_gradient else 'forward'}"
        where = f"micro-batch {micro_batch}" + (f", chunk {chunk}" if num_chunks > 1 else "")
        raise gave_up(f"{what} ({where})", f"rank {message.peer}", error, f"rank {message.peer}") from None
    message.request = message.tensor = None  # done: the lesson may hold the message to the step's end, not its buffer
