"""``miner scan``: build zoo models, compile them with Inductor, capture their post-grad graphs."""
