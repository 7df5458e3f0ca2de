"""Where a DDTree decode step's GPU time goes, read from SGLang's torch-profiler trace of a live server.

The trace (`/start_profile` with CPU and GPU activities and Python stacks) records every GPU kernel,
copy and memset with the correlation id of the runtime call that launched it, and every Python call
of the scheduler's thread. A GPU event belongs to the Python functions on the stack when its launch
ran (for a replayed CUDA graph, the function that replayed it); `PARTS` names a part by the first
function found on that stack, innermost first, and splits attention kernels from the rest by name.
A part's time is the union of its events' intervals, not their sum: with programmatic dependent
launch a kernel starts while the one before it still runs and waits inside (the merge after the
prefix kernel), so durations overlap. Per-step figures divide by the DDTree rounds the trace holds
(`forward_batch_generation` of the DDTree worker). What the GPU did not account for in a step (host
work, launch and sync gaps) is the unprofiled step time less the GPU's busy time: report.py computes it
from the bench's TPOT.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

# Innermost match wins: (function on the launch's Python stack, part name).
PARTS = [
    ("_append_target_hidden_to_draft_kv_by_loc", "drafter KV append"),
    ("_run_draft_backbone", "drafter"),
    ("_compute_draft_topk_log_probs_and_token_ids", "draft head top-k"),
    ("build_ddtree_tree_gpu", "tree build"),
    ("build_ddtree_tree", "tree build"),
    ("compile_ddtree_tree", "mask build"),
    ("_accept_tree", "accept and sampling"),
    ("move_accept_tokens_to_target_kvcache", "KV move"),
    ("prepare_for_verify", "verify inputs"),
]
TARGET = "target verify"
STEP_FUNCTION = re.compile(r"ddtree_worker_v2\.py\(\d+\): forward_batch_generation$")
TARGET_FUNCTION = "forward_batch_generation"  # the target worker's, inside the DDTree step
ATTENTION = re.compile(r"tree_block|prefix_\w*kernel|merge_parts|_fwd_kernel|_fwd_grouped_kernel|extend_attention|"
                       r"decode_att|attention", re.IGNORECASE)
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def load_events(path: str | Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _function(name: str) -> str:
    """'sglang/srt/x.py(12): fn' -> 'fn'."""
    return name.rsplit(": ", 1)[-1]


def _stacks(events: list[dict], queries: list[tuple[float, tuple]]) -> dict[tuple, list[str]]:
    """For each (time, (pid, tid)) query, the Python frames open on that thread then, outermost first."""
    frames = defaultdict(list)
    for e in events:
        if e.get("cat") == "python_function" and e.get("ph") == "X":
            frames[(e["pid"], e["tid"])].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"]))
    out: dict[tuple, list[str]] = {}
    by_thread = defaultdict(list)
    for t, thread in queries:
        by_thread[thread].append(t)
    for thread, times in by_thread.items():
        fs = sorted(frames.get(thread, []), key=lambda f: (f[0], -f[1]))
        stack: list[tuple] = []
        i = 0
        for t in sorted(set(times)):
            while i < len(fs) and fs[i][0] <= t:
                while stack and stack[-1][1] < fs[i][0]:
                    stack.pop()
                stack.append(fs[i])
                i += 1
            while stack and stack[-1][1] < t:
                stack.pop()
            out[(t, thread)] = [f[2] for f in stack]
    return out


def classify(stack: list[str], kernel: str, graph: bool) -> str:
    """The part a GPU event belongs to, from its launch's Python stack (outermost first) and its name."""
    functions = [_function(n) for n in stack]
    in_step = any(STEP_FUNCTION.search(n) for n in stack)
    if not in_step:
        return "outside the DDTree step (scheduler)"
    for fn in reversed(functions):
        for name, part in PARTS:
            if fn == name:
                if part == "drafter":
                    return "drafter attention" if ATTENTION.search(kernel) else "drafter (rest of the model)"
                return part
    step_depth = max(i for i, n in enumerate(stack) if STEP_FUNCTION.search(n))
    if TARGET_FUNCTION in functions[step_depth + 1:]:
        if not graph:
            return "verify inputs (graph buffers, mask copy)"
        return "target verify attention" if ATTENTION.search(kernel) else "target verify (rest of the model)"
    return "step bookkeeping"


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals in microseconds, as milliseconds."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total / 1e3


def breakdown(path: str | Path) -> dict:
    """Per-step GPU milliseconds by part, the step count, and the kernels behind the attention parts."""
    events = load_events(path)
    runtime = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            runtime[e["args"]["correlation"]] = e
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES and e.get("ph") == "X"]
    launches = {}
    for e in gpu:
        r = runtime.get(e.get("args", {}).get("correlation"))
        if r is not None:
            launches[id(e)] = (float(r["ts"]), (r["pid"], r["tid"]), "Graph" in r["name"])
    stacks = _stacks(events, [(t, thread) for t, thread, _ in launches.values()])
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    kernels: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    everything = []
    for e in gpu:
        span = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        everything.append(span)
        launch = launches.get(id(e))
        part = "unattributed" if launch is None else \
            classify(stacks.get((launch[0], launch[1]), []), e.get("name", ""), launch[2])
        intervals[part].append(span)
        if "attention" in part:
            kernels[part][e.get("name", "?")[:80]].append(span)
    steps = sum(1 for e in events if e.get("cat") == "python_function" and STEP_FUNCTION.search(e.get("name", "")))
    wall = [float(e["dur"]) / 1e3 for e in events
            if e.get("cat") == "python_function" and STEP_FUNCTION.search(e.get("name", ""))]
    n = max(steps, 1)
    parts = {k: _union_ms(v) / n for k, v in intervals.items()}
    return {
        "steps": steps,
        "parts_ms": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
        "gpu_busy_ms": _union_ms(everything) / n,
        "attention_kernels_ms": {p: {k: _union_ms(v) / n for k, v in ks.items()} for p, ks in kernels.items()},
        "profiled_step_wall_ms": sum(wall) / n if wall else None,
    }
