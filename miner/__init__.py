"""miner: mine fusion opportunities from torch.compile's post-grad graphs."""

__version__ = "0.1.0"
