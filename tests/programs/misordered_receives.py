"""Two receives posted in the other order than their sends."""
import torch

import common

args = common.parse_args(__doc__)
rank, _, _ = common.setup(args)
# rank 0 sends micro-batches 0 and 1 in one group; rank 1 posts its receives of them the other way round
first, second = torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)
if rank == 0:
    common.post(common.Send(0, first, False), common.Send(1, second, False))
else:
    one, zero = common.post(common.Recv(1, first.shape, False), common.Recv(0, first.shape, False)).wait()
    print("matched" if one.sum() == 6 and zero.sum() == 0 else "swapped", flush=True)
common.wait_for_sends()
common.finish()
