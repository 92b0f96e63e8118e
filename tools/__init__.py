"""Command-line tools: demo, bench (and, later, the graph-debug TUI)."""
