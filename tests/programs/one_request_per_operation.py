"""Put into a script (tests/test_one_request.py): common.covering undone, as if every backend answered one request
per operation: the group's first request taken for its first operation's, every other operation's taken as done."""
import common


class Done:
    def wait(self):
        return True


def covering(requests, count):
    return requests + [Done()] * (count - len(requests))


common.covering = covering
