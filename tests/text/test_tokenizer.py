"""The tokenizer built without transformers gives transformers' ids, text and chat prompts:
a GGUF's byte-level BPE (SmolLM2's file, and a small written one with a Llama 3 split, BOS and
added tokens), a directory's ``tokenizer.json``; presets and bare directories are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrt.text import NoTokenizer, load_tokenizer
from graphrt.text.gguf_vocab import _byte_alphabet
from graphrt.text.template import render_chat
from tests.tools.test_cli_generate import needs_smollm2

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

TEXTS = [
    "What is the capital of France?",
    "  leading spaces\n\n\ttabs and\r\nnew lines",
    "2024-11-24: 12345 a1b2 3.14159",
    "émoji 🎉 中文 日本語 한국어 ü",
    "<|im_start|>user\nhi<|im_end|> <think>x</think>",
    "don't I'll we've THEY'RE",
    "x = [1, 2, 3]\nprint(x)  # ok",
    "",
]
CHATS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
]


def same_as_transformers(mine: object, theirs: object) -> None:
    for text in TEXTS:
        ids = mine.encode(text)  # type: ignore[attr-defined]
        assert ids == theirs.encode(text), text  # type: ignore[attr-defined]
        assert mine.decode(ids) == theirs.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]
        assert mine.decode(ids, skip_special_tokens=False) == theirs.decode(ids)  # type: ignore[attr-defined]
    for chat in CHATS:
        want = theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)  # type: ignore[attr-defined]
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert mine.encode_chat(chat) == list(want)  # type: ignore[attr-defined]


@needs_smollm2
def test_smollm2_gguf_without_transformers() -> None:
    from graphrt.checkpoints.loader import resolve

    mine = load_tokenizer("smollm2")
    assert mine.source == "gguf" and mine.stop_ids == {2} and mine.eos_token_id == 2
    path = resolve("smollm2")
    assert path is not None
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    same_as_transformers(mine, theirs)


def write_gguf(path: Path, pre: str) -> Path:
    """A byte-level vocabulary: two control tokens, the 256 bytes, a few merges, ``<think>``."""
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġa n", "Ġan d", "1 2", "Ã ©"]
    tokens = [
        "<|begin|>",
        "<|end|>",
        *_byte_alphabet().values(),
        *(m.replace(" ", "") for m in merges),
        "<think>",
    ]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (len(tokens) - 3) + [4])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(True)
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    )
    writer.add_chat_template(template + "{% if add_generation_prompt %}assistant:{% endif %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "default"])
def test_written_gguf_matches_transformers(tmp_path: Path, pre: str) -> None:
    path = write_gguf(tmp_path / "tok.gguf", pre)
    mine = load_tokenizer(path)
    assert mine.source == "gguf" and mine.encode("the")[0] == 0  # BOS from add_bos_token
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    same_as_transformers(mine, theirs)


def test_unknown_pre_tokenizer_goes_through_transformers(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tok.gguf", "some-new-split")
    assert load_tokenizer(path).source == "transformers"


@needs_smollm2
def test_directory_tokenizer_json(tmp_path: Path) -> None:
    from graphrt.checkpoints.loader import resolve

    path = resolve("smollm2")
    assert path is not None
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    theirs.save_pretrained(str(tmp_path))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    mine = load_tokenizer(tmp_path)
    assert mine.source == "tokenizer.json" and mine.stop_ids == {0, 2}
    same_as_transformers(mine, transformers.AutoTokenizer.from_pretrained(str(tmp_path)))


def test_no_tokenizer_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoTokenizer, match="preset with random weights"):
        load_tokenizer("tiny-llama")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(NoTokenizer, match=r"has no tokenizer \(tokenizer.json or one of tokenizer.model"):
        load_tokenizer(tmp_path)


def test_template_features_render_as_transformers_does() -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "{% if loop.index > 2 %}{% break %}{% endif %}\n  {{ m | tojson }}\n"
        "{% generation %}{{ m['content'] | upper }}{% endgeneration %}{% endfor %}{{ eos_token }}"
    )
    chat = [
        {"role": "user", "content": "é <b>"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "y"},
    ]
    want, _ = render_jinja_template([chat], chat_template=template, eos_token="</s>")
    assert render_chat(template, chat, {"eos_token": "</s>"}) == want[0]
    with pytest.raises(ValueError, match="no tools"):
        render_chat(template, [{"role": "tool", "content": ""}], {})
