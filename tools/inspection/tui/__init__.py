"""``graphrt debug``: a Textual app over a snapshot, one module per view (imports Textual)."""
