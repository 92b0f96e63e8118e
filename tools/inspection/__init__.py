"""Inspection: snapshot tables (`graphrt inspect`), reports, buffer contents and the graph-debug TUI."""
