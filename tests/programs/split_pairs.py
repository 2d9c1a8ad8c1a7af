"""Put into 03 by variant: 1F1B's steady state with each pair split into a send, then a receive."""
import common


def send_forward_recv_backward(micro_batch, output_tensor, recv_micro_batch, shape):
    common.send_forward(micro_batch, output_tensor)
    return common.recv_backward(recv_micro_batch, shape)


def send_backward_recv_forward(micro_batch, grad_input, recv_micro_batch, shape):
    common.send_backward(micro_batch, grad_input)
    return common.recv_forward(recv_micro_batch, shape)


common.send_forward_recv_backward = send_forward_recv_backward
common.send_backward_recv_forward = send_backward_recv_forward
