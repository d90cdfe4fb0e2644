"""One module per ``miner`` verb (see ``miner.cli``)."""
