"""Put into 08 by variant: the pitfall of a generator seeded by rank, so that no shard holds the baseline's slice."""
import os

import common

_seed_for = common.seed_for
common.seed_for = lambda seed, *what: _seed_for(seed, *what, *[os.environ["RANK"]] * (what[0] == "layer"))
