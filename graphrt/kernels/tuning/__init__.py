"""Per-GPU tuning tables of the Triton kernels: the record (:mod:`.table`), its JSON file
(:mod:`.files`) and which one a process runs with (:mod:`.device`). docs/gpu.md says how a
table is chosen and how ``graphrt tune`` writes one for a new GPU."""

from graphrt.kernels.tuning.device import (
    COMMITTED,
    active,
    cache_path,
    choose,
    device_key,
    device_name,
    install,
    install_for,
    using,
)
from graphrt.kernels.tuning.files import TableError, as_json, load, parse, write
from graphrt.kernels.tuning.table import (
    DEFAULT,
    MoeTiles,
    SamplerRule,
    ShapeTile,
    SkinnyRule,
    Tile,
    TuningTable,
    pow2,
)

__all__ = [
    "COMMITTED",
    "DEFAULT",
    "MoeTiles",
    "SamplerRule",
    "ShapeTile",
    "SkinnyRule",
    "TableError",
    "Tile",
    "TuningTable",
    "active",
    "as_json",
    "cache_path",
    "choose",
    "device_key",
    "device_name",
    "install",
    "install_for",
    "load",
    "parse",
    "pow2",
    "using",
    "write",
]
