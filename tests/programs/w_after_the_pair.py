"""Put into 05 by variant: every group waited for as soon as it is posted, so W runs after its pair, not in the wait."""
import common

_post = common.post


class Arrived:
    def __init__(self, tensors):
        self.tensors = tensors

    def wait(self):
        return self.tensors


common.post = lambda *operations: Arrived(_post(*operations).wait())
