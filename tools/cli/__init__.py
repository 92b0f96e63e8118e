"""The command-line commands' own code: demo, generate, argument parsing, console, environment."""
