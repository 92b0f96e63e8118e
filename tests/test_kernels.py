"""Kernel lists read from a real CUDA graph dump (FA3 decode on an H100) and symbol demangling."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrt.capture import KernelCount
from graphrt.capture.kernels import demangle, parse_dot

DOT = Path(__file__).parent / "data" / "fa3_decode_graph.dot"


@pytest.fixture(scope="module")
def parsed() -> tuple[int, tuple[KernelCount, ...]]:
    return parse_dot(DOT.read_text())


def test_fa3_graph_nodes(parsed: tuple[int, tuple[KernelCount, ...]]) -> None:
    num_nodes, kernels = parsed
    assert num_nodes == 4
    assert [k.name for k in kernels] == [
        "at::native::vectorized_elementwise_kernel",
        "flash::prepare_varlen_num_blocks_kernel",
        "cutlass::device_kernel",
        "at::native::reduce_kernel",
    ]
    assert [k.count for k in kernels] == [1, 1, 1, 1]


def test_fa3_graph_launches(parsed: tuple[int, tuple[KernelCount, ...]]) -> None:
    launches = {k.name: k.launch for k in parsed[1]}
    # FA3 persistent kernel: one CTA per SM of an H100 SXM (132), 256 threads, 107 KiB smem
    assert launches["cutlass::device_kernel"] == "132,256,109568"
    assert launches["flash::prepare_varlen_num_blocks_kernel"] == "1,32,0"
    assert launches["at::native::vectorized_elementwise_kernel"] == "6,128,0"
    # a 2-D block is printed in braces, escaped in the DOT text
    assert launches["at::native::reduce_kernel"] == "6,{32,16},0"


def test_repeated_kernels_are_counted() -> None:
    text = DOT.read_text()
    body = text[text.index('"graph_1_node_0"') : text.index('"graph_1_node_0" ->')]
    doubled = text.replace(body, body + body.replace("graph_1_node_", "graph_1_node_x"), 1)
    num_nodes, kernels = parse_dot(doubled)
    assert num_nodes == 8
    assert {k.name: k.count for k in kernels} == {
        "at::native::vectorized_elementwise_kernel": 2,
        "flash::prepare_varlen_num_blocks_kernel": 2,
        "cutlass::device_kernel": 2,
        "at::native::reduce_kernel": 2,
    }


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
        ("_ZN7cutlass13device_kernelIN5flash5ParamEEEvT_", "cutlass::device_kernel"),
        (
            "_ZN5flash32prepare_varlen_num_blocks_kernelILi1ELb1EEEvi",
            "flash::prepare_varlen_num_blocks_kernel",
        ),
        ("_Z15rms_norm_kernelPfPKfi", "rms_norm_kernel"),
        ("_Z3foov", "foo"),
        ("my_plain_kernel", "my_plain_kernel"),
        ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),
        ("", ""),
    ],
)
def test_demangle(symbol: str, name: str) -> None:
    assert demangle(symbol) == name
