"""``graphrt`` command line: every bad value is one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from graphrt import __version__
from graphrt.attention import available_backends
from graphrt.cli import TUI_HINT, build_parser, main
from graphrt.tools.bench.spec import _print as print_spec


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    code, _, err = run(argv, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"graphrt {argv[0]}: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


BAD_DEMO = [
    (["--model", "bogus"], ("--model", "'bogus'", "tiny-llama", "tiny-dsa")),
    (["--device", "gpu"], ("--device", "'gpu'", "auto, cpu, cuda or cuda:N")),
    (["--backend", "bogus"], ("--backend", "'bogus'", "reference")),
    (["--prompts", "0"], ("--prompts", "'0'", "positive integer")),
    (["--max-new-tokens", "x"], ("--max-new-tokens", "'x'", "positive integer")),
    (["--max-new-tokens", "1000"], ("--max-new-tokens", "1000", "at most 448", "--max-context-len")),
    (["--log-level", "loud"], ("--log-level", "'loud'", "debug", "warning")),
]


@pytest.mark.parametrize(("flags", "needles"), BAD_DEMO, ids=[" ".join(f) for f, _ in BAD_DEMO])
def test_demo_bad_values(
    flags: list[str], needles: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error(["demo", *flags], capsys, *needles)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_demo_cuda_on_a_cpu_torch(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(
        ["demo", "--device", "cuda"], capsys, "--device", "'cuda'", "not available", torch.__version__
    )


def test_demo_fa3_without_sgl_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    if "fa3" in available_backends(torch.device("cpu")):
        pytest.skip("fa3 runs here")
    one_line_error(
        ["demo", "--device", "cpu", "--backend", "fa3"], capsys, "--backend", "'fa3'", "available: reference"
    )


@pytest.mark.parametrize("command", ["bench", "bench-spec"])
@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--batch-sizes", "1,x"], ("--batch-sizes", "'1,x'", "comma-separated list of positive integers")),
        (
            ["--batch-sizes", "0"],
            (
                "--batch-sizes",
                "'0'",
            ),
        ),
        (["--iters", "-3"], ("--iters", "'-3'", "positive integer")),
        (["--context", "lots"], ("--context", "'lots'")),
        (["--device", "tpu"], ("--device", "'tpu'")),
        (["--backend", "fa4"], ("--backend", "'fa4'", "choose from")),
    ],
)
def test_bench_bad_values(
    command: str, flags: list[str], needles: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error([command, *flags], capsys, *needles)


def test_inspect_bad_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(["inspect", str(tmp_path / "missing.json")], capsys, "PATH", "missing.json", "not a file")
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    one_line_error(["inspect", str(junk)], capsys, "PATH", "junk.json", "cannot be read")
    one_line_error(["inspect", str(junk), "--width", "0"], capsys, "--width", "'0'")


def test_debug_bad_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("textual")
    one_line_error(["debug", str(tmp_path / "missing.json")], capsys, "PATH", "not a file")


def test_debug_without_textual_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(
        sys.modules, "graphrt.tools.inspection.tui.app", None
    )  # NOTE: import fails as without Textual
    line = one_line_error(["debug", "snap.json"], capsys, "pip install -e '.[tui]'", "graphrt inspect")
    assert TUI_HINT in line


def test_unknown_command_and_missing_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["frobnicate"], capsys)
    assert code == 2 and "invalid choice: 'frobnicate'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run([], capsys)
    assert code == 2 and "required: COMMAND" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"graphrt {__version__}"


def test_every_flag_has_help_and_shown_default() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():  # type: ignore[attr-defined]
        for action in command._actions:
            if action.dest == "help":
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        text = command.format_help()
        assert "(default:" in text, name
    demo = sub.choices["demo"].format_help()  # type: ignore[attr-defined]
    assert "(default: auto)" in demo and "(default: 32)" in demo and "{auto,fa3,reference" in demo


def test_bench_writes_a_new_file_each_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new" / "dir"
    argv = [
        "bench",
        "--device",
        "cpu",
        "--batch-sizes",
        "1",
        "--iters",
        "3",
        "--context",
        "16",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert main(argv) == 0
    files = sorted(out.glob("decode_cpu_reference_*.json"))
    assert len(files) == 2
    result = json.loads(files[0].read_text())
    assert result["args"]["batch_sizes"] == [1] and result["args"]["iters"] == 3
    assert result["timestamp"].endswith("+00:00") and result["timer"] == "perf_counter"
    assert result["env"]["torch"] == torch.__version__ and "git_commit" in result
    (row,) = result["rows"]
    assert row["bs"] == 1 and row["eager_us"]["p10"] <= row["eager_us"]["p50"] <= row["eager_us"]["p90"]
    assert "speedups are not measured on the CPU" in " ".join(capsys.readouterr().out.split())
    assert row["speedup"] is None


def test_piped_tables_keep_whole_names(capsys: pytest.CaptureFixture[str]) -> None:
    stats = {"p10": 1.0, "p50": 2.0, "p90": 3.0}
    rows = [
        {"topk": 1, "mode": mode, "bs": 1, "tokens": 1, "eager_us": stats, "graph_us": stats}
        | {"graph_host_us": stats, "speedup": 1.0, "max_abs_diff": 0.0}
        for mode in ("TARGET_VERIFY", "DRAFT_DECODE", "DRAFT_EXTEND")
    ]
    result = {"context": 512, "env": {"device": "cpu"}, "backend": "reference", "timer": "perf_counter"}
    print_spec(result | {"engine": "emulated", "rows": rows}, Path("x.json"))
    out = capsys.readouterr().out  # NOTE: captured stdout is not a terminal, as in a pipe
    for mode in ("TARGET_VERIFY", "DRAFT_DECODE", "DRAFT_EXTEND"):
        assert f" {mode} " in out
    assert "…" not in out
