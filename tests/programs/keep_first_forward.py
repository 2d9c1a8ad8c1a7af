"""Put into 05 by variant: its hooks note each Linear's input in the first forward too, keeping every activation."""
import torch

_get_gradient_edge = torch.autograd.graph.get_gradient_edge
# noted under no_grad too, where there is no edge to note, as a hook that keeps W's inputs from F would
torch.is_grad_enabled = lambda: True
torch.autograd.graph.get_gradient_edge = lambda tensor: _get_gradient_edge(tensor) if tensor.requires_grad else None
