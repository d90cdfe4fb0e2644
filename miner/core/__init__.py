"""The nouns every stage shares: records, patterns, candidates, dtypes, op binding, source rendering, the workspace, errors."""
