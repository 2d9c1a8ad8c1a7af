"""The rules that keep the point-to-point helpers' promises, each named, with the test that checks it
(tests/test_guarantees.py breaks each through its name). Every send and receive of every script runs
through them: common.post() calls hold_back, wire_tag, stay_local and posted; a receive's tensor comes
through arrive (wait, then release_on_arrival); wait_for_sends() is release_all. The names and these
contracts are what a reader of 01-03 needs; the bodies are how each rule is kept.

release_on_arrival  a send is let go once a tensor from its peer proves it arrived (test_memory_follows_inflight)
hold_back   --sync-sends runs a rank's groups one after another, as NCCL does (test_sync_sends_catches_a_*)
wire_tag    --sync-sends matches receives by order alone, as NCCL does (test_guarantees.py::test_wire_tag)
stay_local  a link of a rank to itself stays in memory: gloo cannot send to itself (test_zbv.py's world of one)
wait        a failed wait is one sentence naming the rank waited for (test_stuck_rank_times_out)
"""

import collections
import dataclasses

import harness

sync_sends = False  # --sync-sends: NCCL's rules on gloo
num_chunks = 1  # model chunks per rank, named in a failed wait's sentence when more than one
in_transit = {}  # Link -> Message: sends posted and not yet let go
groups = 0  # groups posted so far
unwaited = []  # receives (Messages) posted and not yet waited for
local = {}  # tag -> tensor: sent from one of this rank's chunks to another


# Where one tensor travels: the peer (a rank of the world), the tag that names it on the wire, and what it
# is (chunk: this rank's model chunk that sends or receives it).
Link = collections.namedtuple("Link", "peer tag micro_batch chunk is_gradient")


def tag(micro_batch, boundary, is_gradient, num_stages):
    """A tensor's name on the wire: its micro-batch, the boundary it crosses (between stages b and b + 1)
    and its direction, so that gloo gives a receive only its own tensor, when a peer sends both kinds."""
    return (micro_batch * num_stages + boundary) * 2 + is_gradient


@dataclasses.dataclass(eq=False)
class Message:
    """A tensor sent or received: its Link, its buffer, and the request to wait for once posted."""
    link: object
    tensor: object
    is_send: bool
    request: object = None
    group: int = 0  # the count of groups posted before its own


def posted(messages, requests):
    """Note a group's sends (in transit until let go) and receives (to wait for), and tell the harness."""
    global groups
    harness.posted(messages)
    for message, request in zip(messages, requests):
        message.request = request
        message.group = groups
        if message.is_send:
            in_transit[message.link] = message
        else:
            unwaited.append(message)
    groups += 1


def release_on_arrival(arrival):
    """Every rank posts its half of each exchange in the same order (as NCCL needs), so the peer sent this
    tensor after posting its receive of all we sent it up to the group that receives this: let go of those."""
    for link in [link for link, message in in_transit.items()
                 if link.peer == arrival.link.peer and message.group <= arrival.group]:
        release(link)


def hold_back():
    """--sync-sends: NCCL runs a rank's groups one after another, each done once its sends are received
    and its receives have arrived: what was posted earlier holds back the group about to be posted."""
    while sync_sends and unwaited:
        message = unwaited.pop(0)
        wait(message.request, message.link, "recv")
    while sync_sends and in_transit:
        release(next(iter(in_transit)))


def wire_tag(link):
    """--sync-sends: NCCL ignores tags and matches by order alone; a schedule posting in the wrong order
    then fails the gradient check on gloo too."""
    return 0 if sync_sends else link.tag


def stay_local(link, tensor=None):
    """A tensor sent from one of this rank's chunks to another stays here: kept, when sent (tensor), and
    taken, as a received Message, by the receive (the receiving chunk's Link has the same tag)."""
    if tensor is not None:
        local[link.tag] = tensor
        return None
    return Message(link, local.pop(link.tag), is_send=False)


def arrive(message):
    """A posted receive's tensor (None where the pipeline ends), once here; the sends it proves received
    are let go of."""
    if message is None:
        return None
    if message in unwaited:  # unless a later group has waited for it already (hold_back)
        unwaited.remove(message)
        wait(message.request, message.link, "recv")
    release_on_arrival(message)
    return message.tensor


def release(link):
    """Wait until the peer has the tensor sent on this link, and let go of it, which frees its buffer."""
    if link in in_transit:
        wait(in_transit.pop(link).request, link, "send")


def release_all():
    """Every send still in transit: all must be received before the step ends."""
    assert not local, f"received by no one: {sorted(local)}"
    for link in list(in_transit):
        release(link)


def wait(request, link, verb):
    try:
        with harness.record("wait", link.micro_batch, link.chunk):
            request.wait()  # no timeout here: on NCCL a timed wait blocks the host; --timeout bounds it
    except RuntimeError as error:
        what = f"{verb}_{'backward' if link.is_gradient else 'forward'}"
        where = f"micro-batch {link.micro_batch}" + (f", chunk {link.chunk}" if num_chunks > 1 else "")
        raise harness.gave_up(f"{what} ({where})", f"rank {link.peer}", error, f"rank {link.peer}") from None
