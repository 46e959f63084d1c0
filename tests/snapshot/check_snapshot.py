"""Reads a u3m snapshot pickle with PyTorch's own memory-viz module (the torch
venv of ci/install-torch.sh) and prints what it saw as JSON, for
tests/snapshot.rs: event counts per action, what torch.cuda._memory_viz's
trace_plot / segment_plot embed, its text trace's entry count, and segsum."""
import base64
import collections
import json
import pickle
import re
import sys

from torch.cuda import _memory_viz as mv

data = pickle.load(open(sys.argv[1], "rb"))
out = {"actions": collections.Counter(e["action"] for t in data["device_traces"] for e in t)}


def embedded(html):
    # the plot HTML embeds the snapshot as base64 of the pickle (zero-padded)
    m = re.search(r'"base64": "([^"]*)"', html)
    return pickle.loads(base64.b64decode(m.group(1)).rstrip(b"\x00") or b"N.")


for name, plot in (("trace_plot", mv.trace_plot), ("segment_plot", mv.segment_plot)):
    html = plot(data)
    back = embedded(html)
    out[name] = {
        "html_bytes": len(html),
        "same_snapshot": back == data,
        "viz_kind": re.search(r"add_local_files\(local_files, '([^']*)'\)", html).group(1),
    }
text = mv.trace(data)
out["trace_entries"] = [int(n) for n in re.findall(r"^(\d+) entries$", text, re.M)]
out["cudaMalloc_lines"] = text.count("= cudaMalloc(")
out["segsum_segments"] = int(re.search(r"^segments: (\d+)$", mv.segsum(data), re.M).group(1))
out["segments"] = [
    {"address": s["address"], "total_size": s["total_size"], "blocks": len(s["blocks"])}
    for s in data["segments"]
]
print(json.dumps(out))
