"""The split-KV Triton decode attention: kernels, launch, the attend function and the backend, for
MHA/GQA (``triton_kernels``, ``launch``, ``attend``, ``backend``) and dense MLA (``mla_*``)."""
