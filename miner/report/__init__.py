"""``miner report``: the HTML report and the terminal tables."""
