"""The split-KV Triton decode attention: kernels, launch and the attend function."""
