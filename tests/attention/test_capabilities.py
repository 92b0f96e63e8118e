"""Capabilities as data: opt-in ``GraphSupport``, a runtime's ``Needs``, and dispatch rows."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt.attention import ALL_MODES, AttendCall, Backend, GraphSupport, Needs
from graphrt.attention.capabilities import FEATURES
from graphrt.attention.dispatch import Dispatch
from graphrt.attention.reference import ReferenceBackend
from graphrt.step import ForwardMode
from tests.support.paged_util import HEAD_DIM, paged_case


def test_support_is_opt_in_and_names_backend_and_model() -> None:
    needs = Needs((ForwardMode.DECODE,), 4, frozenset({"sinks"}), "the model (TinyLlama)")
    assert "cannot be captured for DECODE (it supports none)" in str(GraphSupport().refusal("b", needs))
    decode = GraphSupport(frozenset({ForwardMode.DECODE}))
    assert decode.refusal("b", needs) == (
        "attention backend 'b' does not declare attention sinks, which the model (TinyLlama) uses"
    )
    assert dataclasses.replace(decode, sinks=True).refusal("b", needs) is None
    small = GraphSupport(ALL_MODES, sinks=True, max_bucket=2)
    assert "buckets up to 2, not 4" in str(small.refusal("b", needs))
    assert Backend.graph_support == GraphSupport()


def test_every_feature_is_a_support_flag_and_unknown_needs_are_refused() -> None:
    flags = {f.name for f in dataclasses.fields(GraphSupport)}
    assert set(FEATURES) <= flags
    with pytest.raises(ValueError, match=r"unknown attention features \['tree'\]"):
        Needs(features=frozenset({"tree"}))


class DecodeOnly(ReferenceBackend):
    name = "decode-only"

    def takes(self, call: AttendCall) -> bool:
        return call.meta.max_seqlen_q == 1


class Yielding(ReferenceBackend):
    name = "base"

    def yields(self, call: AttendCall) -> bool:
        return call.q.shape[0] < 3


def test_a_dispatch_gives_a_step_to_the_first_part_that_takes_what_the_base_yields() -> None:
    cpu = torch.device("cpu")
    row = Dispatch("row", (DecodeOnly(), Yielding()))
    decode = paged_case(cpu, 16, 64, [5, 9], [1, 1])
    extend = paged_case(cpu, 16, 64, [5, 9], [3, 1])
    full = paged_case(cpu, 16, 64, [5, 9, 7], [1, 1, 1])
    calls = [AttendCall(c.q, c.k_cache, c.v_cache, c.meta, HEAD_DIM**-0.5) for c in (decode, extend, full)]
    assert [row.part_for(c).name for c in calls] == ["decode-only", "base", "base"]
    assert row.graph_support is Yielding.graph_support and row.name == "row"
    torch.testing.assert_close(row.forward(calls[0]), ReferenceBackend().forward(calls[0]))


def test_only_a_dispatchs_base_may_own_buffers() -> None:
    from tests.support.toy_backend import ToyBackend

    with pytest.raises(ValueError, match=r"dispatch 'row': part 'toy' has a buffer group; only the last"):
        Dispatch("row", (ToyBackend(), ReferenceBackend()))
