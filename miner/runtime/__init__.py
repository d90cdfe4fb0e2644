"""What generated candidates and promoted fusions import at run time: the launcher, Triton helpers, the rewrite glue.

The only miner code that ``candidates/`` and ``fusions/`` import.
"""
