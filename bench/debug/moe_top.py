"""Print the top kernels of a ``bench model`` MoE JSON's rows (the ``device`` profile)."""

import json
import sys
from pathlib import Path

for path in sys.argv[1:]:
    result = json.loads(Path(path).read_text())
    for row in result["rows"]:
        d = row.get("device") or {}
        print(path.split("/")[-1], "bs", row["bs"], {k: d.get(k) for k in ("busy_us", "span_us", "launches")})
        for k in (d.get("kernels") or [])[:16]:
            print("   ", k)
