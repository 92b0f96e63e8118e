"""Where KV lives: the paged MHA/GQA cache, the dense-MLA latent cache, the sparse-MLA cache
(BF16 or FP8-656), the request table, an encoder-decoder model's encoder KV.

Every cache reserves its last page as the dummy page (pad rows read it, write its first slot);
:class:`ReqToToken` maps each request position to its KV slot and has a dummy request row.
Device tensors, written inside the graph by the step's programs.
"""

from graphrt.kv.encoder import EncoderKV
from graphrt.kv.latent import LatentKVCache, LatentShape
from graphrt.kv.mla import MLAKVCache, MLAShape
from graphrt.kv.paged import KV_DTYPES, KVShape, PagedKVCache, PagedSlots
from graphrt.kv.req_to_token import ReqToToken

__all__ = [
    "KV_DTYPES",
    "EncoderKV",
    "KVShape",
    "LatentKVCache",
    "LatentShape",
    "MLAKVCache",
    "MLAShape",
    "PagedKVCache",
    "PagedSlots",
    "ReqToToken",
]
