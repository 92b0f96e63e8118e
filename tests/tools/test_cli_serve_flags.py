"""``graphrt serve``'s flags are checked before anything loads (issue 40, row 11): a port out of
range, a drain timeout of ``nan``, ``inf`` or below zero, a body limit of zero end in one line
naming the flag and exit code 2, with no model built (``LLM`` is never constructed)."""

from __future__ import annotations

import pytest

from graphrt import llm as llm_module
from graphrt.cli import main


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--port", "70000"),
        ("--port", "0"),
        ("--port", "http"),
        ("--drain-timeout", "nan"),
        ("--drain-timeout", "-1"),
        ("--drain-timeout", "inf"),
        ("--max-body-mb", "0"),
    ],
)
def test_bad_serve_flags_end_in_one_line_before_anything_loads(
    flag: str, value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm_module.LLM, "__init__", lambda *a, **kw: pytest.fail("the model was loaded"))
    assert main(["serve", "--device", "cpu", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and repr(value) in err, err


def test_good_serve_flags_parse() -> None:
    from graphrt.cli import build_parser

    args = build_parser().parse_args(
        ["serve", "--port", "65535", "--drain-timeout", "0", "--api-key", "k", "--deterministic"]
    )
    assert (args.port, args.drain_timeout, args.api_key, args.deterministic) == (65535, 0.0, "k", True)
    assert args.max_body_mb is None and not args.allow_special_tokens
