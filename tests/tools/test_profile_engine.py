"""The README's engine host-work numbers come from ``python -m graphrt.tools.bench.profile_engine``:
keep it working (timings are not asserted, only what they are made of)."""

from __future__ import annotations

import pytest

from graphrt.tools.bench.profile_engine import main


@pytest.mark.parametrize(
    "extra",
    [
        ["--stub"],
        [],
        ["--speculative", "--eager"],
        ["--speculative", "suffix", "--stub"],
        ["--speculative", "ngram", "--stub", "--skip-replay"],
    ],
)
def test_profile_engine_runs(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--batch-sizes", "1,2", "--steps", "3", *extra]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    rows = [line.split() for line in lines if line.strip() and line.split()[0].isdigit()]
    settings = {"spec"} if extra[:2] == ["--speculative", "--eager"] else {"off", "on"}
    method = next((m for m in ("ngram", "suffix") if m in extra), None)
    if method:
        settings = {"on", method}
        # NOTE: the stub's fresh tokens never repeat: no step drafts, every one backs off
        (summary,) = [line for line in lines if line.startswith(f"{method}:")]
        assert "verify_steps 0," in summary and "no_match_rows 0," not in summary
    assert {(int(r[0]), r[1]) for r in rows} == {(bs, s) for bs in (1, 2) for s in settings}
    for r in rows:
        step_us, engine_us = float(r[2]), float(r[3])
        assert 0 < engine_us <= step_us  # the engine's share is the step minus run()
    if not extra:
        # NOTE: an overlapped graphed decode step makes two torch calls outside its replay: the
        # metadata upload and the tokens' copy to the host (each a driver call on a GPU host)
        assert {float(r[4]) for r in rows if r[1] == "on"} == {2.0}
        assert all(float(r[4]) > 2 for r in rows if r[1] == "off")  # + clone, .cpu(), .numpy()


def test_skip_replay_needs_the_stub() -> None:
    with pytest.raises(SystemExit):
        main(["--batch-sizes", "1", "--steps", "3", "--skip-replay"])


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_stub_repeat_drafts_and_accepts_every_round(method: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--batch-sizes", "1,2", "--steps", "4", "--speculative", method, "--stub", "--stub-repeat"]
    assert main([*args, "--num-steps", "4", "--skip-replay"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    rows = {
        (int(r[0]), r[1]): [float(v) for v in r[2:]] for r in map(str.split, lines) if r and r[0].isdigit()
    }
    for bs in (1, 2):
        on, spec = rows[(bs, "on")], rows[(bs, method)]
        assert (on[3], on[4]) == (0.0, bs)  # the plain loop: no verify round, a token a row
        # NOTE: the prompts repeat: every timed step launches a verify round and every row
        # commits its 4 drafts and the bonus token
        assert (spec[3], spec[4]) == (1.0, 5.0 * bs)
        # NOTE: a drafted round makes the plain step's two torch calls outside its replay: the
        # metadata upload and the tokens' copy to the host
        assert on[2] == spec[2] == 2.0
        assert spec[5] == pytest.approx(spec[0] / spec[4], rel=0.01)
