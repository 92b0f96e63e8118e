"""``import graphrt`` (what ``LLM`` needs before its model loads) stays free of the heavy optional
imports: each one is imported by the feature that uses it, never at import time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: Top-level packages (or torch submodules) ``import graphrt`` must not import, and who needs them.
LAZY = {
    "transformers": "a checkpoint whose tokenizer needs it, graphrt.hf",
    "fastapi": "graphrt serve",
    "uvicorn": "graphrt serve",
    "openai": "tests and bench serve",
    "jinja2": "the first chat template",
    "rich": "progress bars, tables",
    "textual": "graphrt debug",
    "gguf": "a GGUF cache miss",
    "sympy": "torch's meta-device references",
    "torch._dynamo": "torch.compile",
    "torch._inductor": "torch.compile",
}


def test_import_graphrt_imports_none_of_the_lazy_packages() -> None:
    code = (
        "import json, sys; import graphrt; "
        f"print(json.dumps(sorted(n for n in {sorted(LAZY)!r} if n in sys.modules)))"
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == [], f"import graphrt imported {found}: import them where they are used ({LAZY})"
