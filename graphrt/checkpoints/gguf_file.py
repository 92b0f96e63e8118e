"""A GGUF file (llama.cpp's format) as a tensor source under Hugging Face names.

Mixture-of-experts architectures (merged expert tensors) are read through
:mod:`graphrt.checkpoints.gguf_moe`. Metadata becomes a ``config.json``-style dict (one key table), tensor names are renamed to
transformers' layout, quantised blocks are dequantised with ``gguf.quants.dequantize``, and the
q/k rows llama.cpp permutes for the ``llama`` architecture are put back in NeoX order (the
inverse of ``convert_hf_to_gguf.py``'s permute, as transformers' GGUF loader does).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphrt.checkpoints.checkpoint import Shape
from graphrt.checkpoints.errors import CheckpointError
from graphrt.checkpoints.gguf_header import check_gguf
from graphrt.checkpoints.gguf_moe import (
    GGUF_MOE,
    Joined,
    has_experts,
    moe_config,
    moe_joined,
    moe_layer_names,
)
from graphrt.checkpoints.hf_config import parse_config
from graphrt.checkpoints.moe_tensors import MOE_NAMES
from graphrt.models.config import ModelConfig
from graphrt.models.parallel import Shard, cut

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
#: ``{arch}.<key>`` in the GGUF metadata → ``config.json`` key.
CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
#: Per GGUF architecture: weights llama.cpp permuted, and the config field giving their heads.
PERMUTED = {"llama": {"self_attn.q_proj.weight": "num_heads", "self_attn.k_proj.weight": "num_kv_heads"}}
SUPPORTED_TYPES = (
    *("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"),
    *("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"),
)
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(name: str, moe: dict[str, str] | None = None) -> str:
    """``blk.3.attn_q.weight`` → ``model.layers.3.self_attn.q_proj.weight``; unknown names kept.

    ``moe``: a MoE architecture's own per-layer names (``ffn_gate_inp.weight`` → ...), first.
    """
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    m = _LAYER.fullmatch(name)
    if m is None:
        return name
    own = (moe or {}).get(f"{m[2]}.{m[3]}")
    if own is not None:
        return f"model.layers.{m[1]}.{own}"
    if m[2] not in LAYER_NAMES:
        return name
    return f"model.layers.{m[1]}.{LAYER_NAMES[m[2]]}.{m[3]}"


def unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs → NeoX halves) per head."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def read_gguf(path: str | Path) -> Any:
    """The ``gguf.GGUFReader`` of ``path``, parsed once per process (the file's size and mtime
    key the cache): the model loader, the tokenizer and the stop ids read the same one.

    :class:`CheckpointError` naming the file and the fault for a file cut short, garbage, or
    with absurd counts: :func:`check_gguf` walks the header first (``gguf`` trusts it).
    """
    path = Path(path).resolve()
    stat = path.stat()
    return _read(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read(path: str, size: int, mtime_ns: int) -> Any:
    reader_class = _reader_class()
    check_gguf(Path(path))
    try:
        return reader_class(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError) as err:
        # NOTE: check_gguf walked the layout; what is left is a duplicate key or tensor name
        raise CheckpointError(f"{path}: not a readable GGUF file: {err}") from None


@functools.cache
def _reader_class() -> type:
    try:
        from gguf import GGUFReader
    except ImportError as err:  # pragma: no cover - the models extra installs it
        raise ImportError(
            f"reading GGUF needs the gguf package ({err}): pip install 'graphrt[models]'"
        ) from err

    class PlainReader(GGUFReader):
        """``GGUFReader`` slicing a plain ndarray view of its memory map.

        NOTE: ``np.memmap``'s ``__getitem__`` and ``__array_finalize__`` are Python code, run
        for each of the ~150k metadata array elements of SmolLM2's GGUF (vocabulary, merges,
        token types): 4.0 s to parse it, 1.3 s through the plain view (same fields and tensors,
        tests/test_gguf_reader.py).
        """

        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            dt = np.dtype(dtype)
            arr = plain[offset : offset + dt.itemsize * int(count)].view(dt)[: int(count)]
            return arr.view(arr.dtype.newbyteorder(override_order or self.byte_order))

    return PlainReader


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _check_arch(arch: Any, moe: bool) -> None:
    """``ValueError`` naming ``arch`` when graphrt does not load it (with or without experts)."""
    if moe and arch not in GGUF_MOE:
        raise ValueError(
            f"GGUF architecture {arch!r} with mixture-of-experts layers is not supported; "
            f"supported MoE architectures: {', '.join(GGUF_MOE)}"
        )
    if not moe and arch not in ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHITECTURES)} "
            f"(mixture of experts: {', '.join(GGUF_MOE)})"
        )


def _raw_config(reader: Any, tensors: dict[str, Any]) -> dict[str, Any]:
    arch = _field(reader, "general.architecture")
    moe = has_experts(arch, lambda key: _field(reader, key), tensors)
    _check_arch(arch, moe)
    raw: dict[str, Any] = {"architectures": [ARCHITECTURES.get(arch)]}
    for key, hf_key in CONFIG_KEYS.items():
        value = _field(reader, f"{arch}.{key}")
        if value is not None:
            raw[hf_key] = value
    raw.setdefault("vocab_size", int(tensors["token_embd.weight"].shape[-1]))
    raw["tie_word_embeddings"] = "output.weight" not in tensors
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raw["rope_scaling"] = {"rope_type": scaling, "factor": _field(reader, f"{arch}.rope.scaling.factor")}
        original = _field(reader, f"{arch}.rope.scaling.original_context_length")
        if original is not None:
            raw["rope_scaling"]["original_max_position_embeddings"] = original
    if moe:
        moe_config(arch, lambda key: _field(reader, key), tensors, raw)
    return raw


def _shape(t: Any) -> Shape:
    """A GGUF tensor's logical (row-major) shape: its dims reversed."""
    return tuple(int(d) for d in reversed(t.shape))


def _dequantize(t: Any) -> torch.Tensor:
    """GGUF tensor ``t`` on the host, dequantised, in its logical shape (a writable copy)."""
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type)).reshape(_shape(t)))


class GGUFFile:
    """:class:`~graphrt.checkpoints.checkpoint.TensorSource` for a ``.gguf`` file (memory-mapped)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.reader = read_gguf(self.path)
        by_gguf = {t.name: t for t in self.reader.tensors}
        try:
            self.arch = _field(self.reader, "general.architecture")
            #: The ``config.json``-style dict the metadata gives (what the conversion cache stores).
            self.raw_config = _raw_config(self.reader, by_gguf)
            self.config: ModelConfig = parse_config(self.raw_config)
        except (ValueError, KeyError, TypeError) as err:
            what = f"no tensor {err}" if isinstance(err, KeyError) else str(err)
            raise CheckpointError(f"{self.path}: {what}") from None
        rope_freqs = by_gguf.pop("rope_freqs.weight", None)
        self.freq_factors = None if rope_freqs is None else torch.from_numpy(np.array(rope_freqs.data))
        self._gguf = by_gguf
        arch_name = self.config.architecture
        moe = arch_name in MOE_NAMES
        #: HF tensors made of several GGUF tensors (merged experts, split ``kv_b``), by HF name.
        self.joined: dict[str, Joined] = moe_joined(arch_name, self.config.num_layers, by_gguf) if moe else {}
        parts = {p for j in self.joined.values() for p in j.parts}
        for name, joined in self.joined.items():
            absent = [p for p in joined.parts if p not in by_gguf]
            if absent:
                raise CheckpointError(f"{self.path}: no tensor {absent[0]!r} (a part of {name!r})")
        names = moe_layer_names(arch_name) if moe else None
        self.tensors = {hf_name(name, names): t for name, t in by_gguf.items() if name not in parts}

    def shapes(self) -> dict[str, Shape]:
        """Logical (row-major) shapes; ``CheckpointError`` on a quantisation type not supported."""
        parts = [(p, self._gguf[p]) for j in self.joined.values() for p in j.parts]
        for name, t in (*self.tensors.items(), *parts):
            if t.tensor_type.name not in SUPPORTED_TYPES:
                raise CheckpointError(
                    f"{self.path}: tensor {name!r} is {t.tensor_type.name}: quantisation type not supported "
                    f"(supported: {', '.join(SUPPORTED_TYPES)})"
                )
        out = {name: _shape(t) for name, t in self.tensors.items()}
        try:
            return out | {name: j.shape({p: _shape(t) for p, t in parts}) for name, j in self.joined.items()}
        except RuntimeError as err:  # NOTE: parts whose shapes do not join (a damaged file)
            raise CheckpointError(f"{self.path}: merged tensors do not fit together: {err}") from None

    def dequantized(self, name: str) -> torch.Tensor:
        """All of tensor ``name`` on the host: dequantised (float32 for quantised blocks, the
        file's own float dtype otherwise), q/k rows back in NeoX order; a joined tensor
        (merged experts, split ``kv_b``) made whole from its GGUF parts."""
        joined = self.joined.get(name)
        if joined is not None:
            return joined.join(*(_dequantize(self._gguf[p]) for p in joined.parts)).contiguous()
        w = _dequantize(self.tensors[name])
        heads = PERMUTED.get(self.arch, {}).get(name.split(".", 3)[-1])
        return w if heads is None else unpermute(w, getattr(self.config, heads))

    def read(self, name: str, device: torch.device, shard: Shard) -> torch.Tensor:
        """``shard``'s slice of ``name``, dequantised.

        NOTE: the whole tensor is dequantised (on the host) and only the slice kept: quantised
        blocks run along the last GGUF dim (the checkpoint's columns, 32 or 256 values a block),
        so a column shard does not start on a block boundary in general, and a row-permuted q/k
        is put back in order over whole heads first.
        """
        return cut(self.dequantized(name), shard).to(device)
