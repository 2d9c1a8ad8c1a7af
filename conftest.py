"""The tests' fixtures: the baseline and memoized launches of the scripts (tests/launch.py starts them)."""

import pytest

from tests.launch import SIZE, launch


@pytest.fixture
def baseline(runs):
    """The baseline (00) at SIZE, in the same session: nothing is compared against stored numbers."""
    return runs("00_baseline.py", 0, *SIZE)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Memoized launches: each configuration runs once per session, whichever tests ask for it."""
    cache, tmp_path = {}, tmp_path_factory.mktemp("runs")

    def get(script, nproc, *flags):
        key = (script, nproc, flags)
        if key not in cache:
            cache[key] = launch(tmp_path, script, nproc, *flags)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def again(tmp_path_factory):
    """A launch not memoized, for a paced run that noise may have spoiled, started again (tests.launch.settled,
    and 07's paced all-reduce test). These cores are shared: a stretch of noise makes every message slower (the
    excess over theory, 0.01 on a quiet machine, then triples or more) or a computation longer than the pace."""

    def launch_again(script, nproc, *flags):
        return launch(tmp_path_factory.mktemp("again"), script, nproc, *flags)

    return launch_again
