"""Put into 08 by variant: each of three shards adds the partial sums of an all-reduce in an order of its own."""
import torch
import torch.distributed as dist

_all_reduce = dist.all_reduce


class Summed:
    def wait(self):
        return True


def all_reduce(tensor, group=None, async_op=False):
    if dist.get_world_size(group) != 3:  # not the shards'
        return _all_reduce(tensor, group=group, async_op=async_op)
    parts, me = [torch.empty_like(tensor) for _ in range(3)], dist.get_rank(group)
    dist.all_gather(parts, tensor, group=group)
    tensor.copy_(parts[me] + parts[(me + 1) % 3] + parts[(me + 2) % 3])
    return Summed()


dist.all_reduce = all_reduce
