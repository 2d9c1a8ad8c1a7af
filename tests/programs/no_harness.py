"""Put in place of harness/ by tests/test_without_harness.py: every name of the harness a function that does
nothing and returns None, but track, which hands its tensor back as it is (the harness's own does too)."""


def track(tensor):
    return tensor


def __getattr__(name):
    return lambda *args, **kwargs: None
