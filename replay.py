"""The unit-time replay of a schedule: when each computation starts if each takes one unit
(replay), and so when each tensor travels (timetable, which 06 follows). The harness uses replay
for the theory of every schedule.
"""

from typing import NamedTuple

from common import Recv, Send, stage_of


def replay(schedules, stage_of, num_stages, duration=lambda kind: 1.0):
    """When each computation starts if every rank runs its schedule of (kind, chunk, micro_batch) in
    order, a computation takes duration(kind), and messages take no time: a forward waits for the
    previous stage's, a backward for the next stage's (the last stage's for its own forward), a weight
    gradient for its B. stage_of(rank, chunk) places the chunks. Returns {(stage, kind, micro_batch): start}."""
    ends, starts, clock, position = {}, {}, [0.0] * len(schedules), [0] * len(schedules)
    progress = True
    while progress:
        progress = False
        for rank, schedule in enumerate(schedules):
            while position[rank] < len(schedule):
                kind, chunk, micro_batch = schedule[position[rank]]
                stage = stage_of(rank, chunk)
                needed_kind, needed_stage = {"forward": ("forward", stage - 1),
                                             "backward": ("backward", stage + 1) if stage < num_stages - 1
                                             else ("forward", stage),
                                             "weight": ("backward", stage)}[kind]
                needed = needed_kind, micro_batch, needed_stage
                if needed_stage >= 0 and needed not in ends:
                    break  # its input is not ready yet: another rank first
                start = max(clock[rank], ends.get(needed, 0.0))
                starts[stage, kind, micro_batch] = start
                clock[rank] = ends[kind, micro_batch, stage] = start + duration(kind)
                position[rank] += 1
                progress = True
    return starts


class Moment(NamedTuple):
    """What a rank does at one moment of a replayed schedule, in this order."""
    sends: list  # (kind, chunk, micro_batch) of its computation that ends now, if its result goes to another stage
    recvs: list  # Recvs of the tensors made now for it
    computation: tuple  # (kind, chunk, micro_batch) that it starts now, or None
    releases: list  # Sends (without their tensor) of its own that their receiver uses now


def timetable(schedules, rank, shapes):
    """Rank's moments, in time order, when every computation takes one unit (replay): each tensor is sent and
    received the moment it is made, and let go of by its sender when its receiver uses it. schedules: every
    rank's (kind, chunk, micro_batch) in order, its chunks placed as setup placed them; shapes: each micro-batch's."""
    num_stages = 1 + max(stage_of(other, chunk) for other, schedule in enumerate(schedules) for _, chunk, _ in schedule)
    starts = replay(schedules, stage_of, num_stages)
    moments = {}
    moment = lambda time: moments.setdefault(time, Moment([], [], None, []))  # noqa: E731
    for other, schedule in enumerate(schedules):
        for kind, chunk, i in schedule:
            stage = stage_of(other, chunk)
            if other == rank:
                moments[starts[stage, kind, i]] = moment(starts[stage, kind, i])._replace(computation=(kind, chunk, i))
            target = {"forward": stage + 1, "backward": stage - 1}.get(kind, -1)  # the stage that uses its result
            if not 0 <= target < num_stages:
                continue
            is_gradient, made, used = kind == "backward", starts[stage, kind, i] + 1, starts[target, kind, i]
            if other == rank:
                moment(made).sends.append((kind, chunk, i))
                moment(used).releases.append(Send(i, None, is_gradient, chunk))
            if stage_of(rank, target_chunk := int(target >= len(schedules))) == target:  # a stage of this rank's
                moment(made).recvs.append(Recv(i, shapes[i], is_gradient, target_chunk))
    return [moments[time] for time in sorted(moments)]
