"""Print the top kernels of a ``bench model`` MoE JSON's rows (the ``device`` profile)."""

import json
import sys

for path in sys.argv[1:]:
    result = json.load(open(path))
    for row in result["rows"]:
        d = row.get("device") or {}
        print(path.split("/")[-1], "bs", row["bs"], {k: d.get(k) for k in ("busy_us", "span_us", "launches")})
        for k in (d.get("top_kernels") or [])[:16]:
            print("   ", k)
