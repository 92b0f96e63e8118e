"""Kernel lists read from a real CUDA graph dump (FA3 decode on an H100) and symbol demangling."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from graphrt.capture import KernelCount
from graphrt.capture import kernels as kernels_module
from graphrt.capture.kernels import demangle, parse_dot, short_name, split_launch, with_times

DOT = Path(__file__).parents[1] / "data" / "fa3_decode_graph.dot"


needs_cxxfilt = pytest.mark.skipif(
    importlib.util.find_spec("cxxfilt") is None, reason="needs cxxfilt (a base dependency; absent offline)"
)


@pytest.fixture(scope="module")
def parsed() -> tuple[int, tuple[KernelCount, ...]]:
    return parse_dot(DOT.read_text())


FA3 = "cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
MUL = "at::native::vectorized_elementwise_kernel<8, at::native::AUnaryFunctor<c10::BFloat16"
PREPARE = "flash::prepare_varlen_num_blocks_kernel<1, true>"
REDUCE = "at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16"


def by_prefix(kernels: tuple[KernelCount, ...], prefix: str) -> KernelCount:
    (found,) = [k for k in kernels if k.name.startswith(prefix)]
    return found


def test_fa3_graph_nodes(parsed: tuple[int, tuple[KernelCount, ...]]) -> None:
    num_nodes, kernels = parsed
    assert num_nodes == 4
    assert [k.name.split("<")[0] for k in kernels] == [
        "at::native::vectorized_elementwise_kernel",
        "flash::prepare_varlen_num_blocks_kernel",
        "cutlass::device_kernel",
        "at::native::reduce_kernel",
    ]
    assert [k.count for k in kernels] == [1, 1, 1, 1]


@needs_cxxfilt
def test_fa3_kernel_keeps_its_templates(parsed: tuple[int, tuple[KernelCount, ...]]) -> None:
    fa3 = by_prefix(parsed[1], FA3)
    # the template arguments say which FA3 instance this is: Sm90, bf16, head dim 64, persistent
    assert "flash::CollectiveMainloopFwdSm90<2, " in fa3.name and "cutlass::bfloat16_t" in fa3.name
    assert "flash::VarlenDynamicPersistentTileScheduler<64, 192, 128, 128" in fa3.name
    assert not fa3.name.startswith("void ") and not fa3.name.endswith(")")  # no return type, no args
    assert by_prefix(parsed[1], PREPARE).name == PREPARE
    assert "{lambda(float, float)#1}" in by_prefix(parsed[1], REDUCE).name  # parentheses inside templates


@needs_cxxfilt
def test_short_names_elide_deep_templates(parsed: tuple[int, tuple[KernelCount, ...]]) -> None:
    assert short_name(by_prefix(parsed[1], FA3).name) == (
        "cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<…> > >"
    )
    assert short_name("a<b<c, d<e>>, f>", depth=1) == "a<b<…>, f>"
    assert short_name("plain_kernel") == "plain_kernel"


@needs_cxxfilt
def test_fa3_graph_launches(parsed: tuple[int, tuple[KernelCount, ...]]) -> None:
    kernels = parsed[1]
    # FA3 persistent kernel: one CTA per SM of an H100 SXM (132), 256 threads, 107 KiB smem
    assert by_prefix(kernels, FA3).launch == "132,256,109568"
    assert by_prefix(kernels, PREPARE).launch == "1,32,0"
    assert by_prefix(kernels, MUL).launch == "6,128,0"
    # a 2-D block is printed in braces, escaped in the DOT text
    assert by_prefix(kernels, REDUCE).launch == "6,{32,16},0"


def test_repeated_kernels_are_counted() -> None:
    text = DOT.read_text()
    body = text[text.index('"graph_1_node_0"') : text.index('"graph_1_node_0" ->')]
    doubled = text.replace(body, body + body.replace("graph_1_node_", "graph_1_node_x"), 1)
    num_nodes, kernels = parse_dot(doubled)
    assert num_nodes == 8
    assert [k.count for k in kernels] == [2, 2, 2, 2]


@needs_cxxfilt
def test_identical_kernels_with_other_grids_are_one_row() -> None:
    text = DOT.read_text()
    body = text[text.index('"graph_1_node_0"') : text.index('"graph_1_node_1"')]
    other = body.replace("graph_1_node_0", "graph_1_node_9").replace("6,128,0", "12,128,0")
    num_nodes, kernels = parse_dot(text.replace(body, body + other, 1))
    assert num_nodes == 5
    mul = by_prefix(kernels, MUL)
    assert (mul.count, mul.launch) == (2, "6 | 12,128,0")
    assert split_launch(mul.launch) == ("6 | 12", "128", "0")


@needs_cxxfilt
def test_profiler_times_attach_by_name(parsed: tuple[int, tuple[KernelCount, ...]]) -> None:
    fa3 = by_prefix(parsed[1], FA3)
    times = {f"void {fa3.name}(flash::Params)": 7.5, "Memset (Device)": 0.5, "unrelated": 1.0}
    timed = with_times((*parsed[1], KernelCount("memset", 1)), times)
    assert by_prefix(timed, FA3).time_us == 7.5
    assert timed[-1].time_us == 0.5
    assert by_prefix(timed, MUL).time_us is None


def test_demangle_without_cxxfilt_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels_module, "_cxa_demangle", lambda symbol: None)
    assert demangle("_ZN7cutlass13device_kernelIN5flash5ParamEEEvT_") == "cutlass::device_kernel"


def test_non_kernel_nodes_counted_by_type() -> None:
    text = (
        'digraph dot {\n"n0"[style="bold" shape="record" label="{MEMSET\n| {dst | 0x0}\n}"];\n'
        '"n1"[style="bold" shape="record" label="{MEMCPY\n| {src | 0x0}\n}"];\n'
        '"n2"[style="bold" shape="record" label="{MEMSET\n| {dst | 0x1}\n}"];\n}\n'
    )
    num_nodes, kernels = parse_dot(text)
    assert num_nodes == 3
    assert {k.name: k.count for k in kernels} == {"memset": 2, "memcpy": 1}


def test_empty_dump() -> None:
    assert parse_dot("digraph dot {\n}\n") == (0, ())


@pytest.mark.parametrize(
    ("symbol", "name"),
    [
        ("_ZN2at6native4workEv", "at::native::work"),
        ("_ZN7cutlass13device_kernelIN5flash5ParamEEEvT_", "cutlass::device_kernel<flash::Param>"),
        (
            "_ZN5flash32prepare_varlen_num_blocks_kernelILi1ELb1EEEvi",
            "flash::prepare_varlen_num_blocks_kernel<1, true>",
        ),
        ("_Z15rms_norm_kernelPfPKfi", "rms_norm_kernel"),
        ("_Z3foov", "foo"),
        ("_ZN12_GLOBAL__N_13fooEv", "(anonymous namespace)::foo"),
        ("my_plain_kernel", "my_plain_kernel"),
        ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),
        ("", ""),
    ],
)
@needs_cxxfilt
def test_demangle(symbol: str, name: str) -> None:
    assert demangle(symbol) == name
