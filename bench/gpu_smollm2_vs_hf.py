"""SmolLM2 greedy tokens, graphrt (graphs, bf16) vs transformers (bf16, same GGUF) on one GPU.

Usage: ``python bench/gpu_smollm2_vs_hf.py PATH.gguf``. Prints both continuations and the first
position where they differ (bf16 may legitimately diverge after a near-tie; the fp32 CPU test
``tests/test_smollm2.py`` is the exact check).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers

from graphrt import Engine
from graphrt.models.tokenizer import chat_prompt, load_tokenizer

QUESTION, NEW = "What is the capital of France?", 24


def main(path: str) -> None:
    tok = load_tokenizer(path)
    ids = chat_prompt(tok, QUESTION)
    ours = Engine(path, device=torch.device("cuda"), max_batch_size=1, max_context_len=256).generate(
        [ids], NEW
    )[0]
    gguf = Path(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    hf = hf.cuda().eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=NEW, do_sample=False)
    theirs = out[0, len(ids) :].tolist()
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    print("graphrt     :", tok.decode(ours, skip_special_tokens=True))
    print("transformers:", tok.decode(theirs, skip_special_tokens=True))
    print("identical" if first is None else f"first difference at token {first}")


if __name__ == "__main__":
    main(sys.argv[1])
