"""Command-line tools on top of the runtime: demo, benches, ``inspect`` and the graph-debug TUI."""
