"""``miner candidates``: candidates and patterns ranked by the time they would save (measured first, predicted marked)."""
