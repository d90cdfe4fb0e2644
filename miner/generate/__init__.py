"""``miner generate``: mined patterns -> fusion candidates (search pattern, replacement, Triton kernel)."""
