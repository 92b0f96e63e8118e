"""The kernel floor: Triton kernels, PDL and launch helpers, scratch workspaces and switches.

Below the models and attention: nothing here knows a model, a mode or a backend.
"""
