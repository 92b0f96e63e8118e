"""``Engine(model, config, **options)``: one typed config; keywords replace its fields."""

from __future__ import annotations

import pytest

from graphrt import Engine, EngineConfig


def test_options_replace_config_fields_and_unknown_ones_are_refused() -> None:
    base = EngineConfig(device="cpu", max_batch_size=2, max_context_len=64)
    engine = Engine("tiny-llama", base, page_size=8)
    assert engine.config == EngineConfig(device="cpu", max_batch_size=2, max_context_len=64, page_size=8)
    assert engine.runtime.config.page_size == 8 and engine.pool.page_size == 8
    assert engine.generate([[1, 2, 3]], 3) == Engine("tiny-llama", base, page_size=8).generate([[1, 2, 3]], 3)
    with pytest.raises(TypeError, match=r"unknown engine option 'max_batch'; options: device, use_graphs"):
        Engine("tiny-llama", base, max_batch=4)


def test_runtime_config_follows_the_engine_config() -> None:
    config = EngineConfig(max_batch_size=4, max_context_len=128, buckets=[1, 4], use_graphs=False)
    runtime = config.runtime_config(None)
    assert runtime.capture_modes == () and runtime.buckets == (1, 4) and runtime.sample
