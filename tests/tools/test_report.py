"""Rows shared by ``inspect`` and the TUI: kernel grouping, times and shares, units, unread page ids."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from graphrt.debug.snapshot import GraphFacts, KernelFacts, Snapshot
from graphrt.tools.inspection import report
from tests.support.snapshots import take

FA3 = "cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::Mainloop<2>, flash::Epi> > >"


def graph(*kernels: KernelFacts) -> GraphFacts:
    return GraphFacts("DECODE", 8, 1, 1.0, 0, len(kernels), 0, kernels, {}, ())


@pytest.mark.parametrize(
    ("us", "text"),
    [
        (None, "-"),
        (0.25, "250 ns"),
        (12.34, "12.3 µs"),
        (250.0, "250 µs"),
        (4200.0, "4.2 ms"),
        (2.5e6, "2.5 s"),
    ],
)
def test_time_units_scale(us: float | None, text: str) -> None:
    assert report.fmt_time(us) == text


def test_kernel_rows_group_by_name_with_time_and_share() -> None:
    # NOTE: snapshots taken before grouping list a kernel once per launch dims
    g = graph(
        KernelFacts("at::native::add<float>", 3, "6", "128", "0", 3.0),
        KernelFacts(FA3, 1, "132", "256", "109568", 9.0),
        KernelFacts("at::native::add<float>", 2, "12", "128", "0", 3.0, pdl=True),
    )
    rows = report.kernel_rows(g)
    assert report.KERNEL_COLUMNS[-1] == "kernel / op" and report.KERNEL_COLUMNS[3] == "PDL"
    assert rows == [
        (
            "1",
            "9 µs",
            "60.0%",
            "",
            "132",
            "256",
            "109568",
            "cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<…> > >",
        ),
        ("5", "6 µs", "40.0%", "✓", "6 | 12", "128", "0", "at::native::add<float>"),
    ]
    assert report.kernel_rows(g, full_names=True)[0][-1] == FA3


def test_pdl_summary_counts_programmatic_edges_or_says_unread() -> None:
    g = graph(KernelFacts("_skinny", 2, pdl=True))
    assert report.pdl_summary(g).startswith("programmatic edges not read")  # older files, no bindings
    read = dataclasses.replace(g, edges=9, programmatic_edges=1)
    assert report.pdl_summary(read) == "1 programmatic edges of 9"


def test_kernel_rows_without_times_sort_by_count() -> None:
    rows = report.kernel_rows(graph(KernelFacts("mul", 1), KernelFacts("index_put_", 4)))
    assert [(r[0], r[1], r[2], r[-1]) for r in rows] == [
        ("4", "-", "-", "index_put_"),
        ("1", "-", "-", "mul"),
    ]


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    return take(tmp_path_factory.mktemp("report"))[1]


def test_page_ids_past_a_rows_length_are_marked_unread(snap: Snapshot, tmp_path: Path) -> None:
    page_size, bucket = snap.config["page_size"], snap.contents.bucket
    assert bucket is not None
    shown = report.buffer_contents(snap, "page_table", bucket)
    assert shown is not None
    lens, table = snap.arrays["cache_seqlens"], snap.arrays["page_table"]
    for i, (status, text) in enumerate(zip(shown.status, shown.values, strict=True)):
        read = math.ceil(int(lens[i]) / page_size)
        unread = table.shape[1] - read
        assert text.endswith(f"┊ {unread} unread") if unread else "unread" not in text, (i, status, text)
        assert text.split(" ┊")[0].split() == [str(v) for v in table[i][:read]]
    # buffers other than the page table are shown whole
    seqlens = report.buffer_contents(snap, "cache_seqlens", bucket)
    assert seqlens is not None and not any("unread" in v for v in seqlens.values)


def test_speculation_rows_round_trip_a_snapshot(snap: Snapshot, tmp_path: Path) -> None:
    from graphrt.debug.reader import load_snapshot
    from graphrt.debug.snapshot import save_snapshot
    from graphrt.engine.stats import EngineStats

    assert report.speculation_rows(snap) == [] and snap.speculation == {}
    stats = EngineStats({}, {}, {}, 10, 0.1, 1, 30, verify_steps=8, acceptance_rate=0.5, tokens_per_round=1.75,
                        backoff={"pauses": 1, "stale_rows": 2}, spec_overlap=True, drafts_proposed=16,
                        drafts_accepted=8, paused_requests=1)  # fmt: skip
    path = tmp_path / "spec.json"
    save_snapshot(dataclasses.replace(snap, speculation=stats.speculation()), path)
    rows = dict(report.speculation_rows(load_snapshot(path)))
    assert rows["speculation"] == "overlapped True, 8 verifies"
    assert rows["acceptance"] == "0.5 (8 of 16 drafts)"
    assert rows["tokens per round"].startswith("1.75 ")
    assert rows["back-off"] == "1 paused now; pauses 1, stale_rows 2"
    assert dict(report.replay_summary(load_snapshot(path)))["acceptance"] == rows["acceptance"]
