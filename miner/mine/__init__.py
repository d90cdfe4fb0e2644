"""``miner mine``: frequent pointwise/reduction subgraphs across captured graphs, each occurrence checked for safety."""
