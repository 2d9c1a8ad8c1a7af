"""Put into 01 by variant: the gradient's receive posted before the send of its activation, which gloo allows."""
import common

_send_forward, _recv_backward, early = common.send_forward, common.recv_backward, []


def send_forward(micro_batch, output_tensor, chunk=0):
    early.append(common.post(common.Recv(micro_batch, output_tensor.shape, True)))
    _send_forward(micro_batch, output_tensor, chunk)


def recv_backward(micro_batch, shape, chunk=0):
    return early.pop().wait()[0] if early else _recv_backward(micro_batch, shape, chunk)


common.send_forward, common.recv_backward = send_forward, recv_backward
