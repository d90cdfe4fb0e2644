"""``miner validate`` and ``miner verify``: a candidate's numerics and rewrite, a fusion's effect inside a model."""
