"""``miner bench``: candidates timed on a GPU against eager and Inductor, per shape."""
