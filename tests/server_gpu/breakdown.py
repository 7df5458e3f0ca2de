"""Where a DDTree (or DFlash chain) decode step's time goes, read from SGLang's torch-profiler trace of a live server.

The trace (`/start_profile` with CPU and GPU activities and Python stacks) records every GPU kernel,
copy and memset with the correlation id of the runtime call that launched it, and every Python call
of the scheduler's thread. A GPU event belongs to the Python functions on the stack when its launch
ran (for a replayed CUDA graph, the function that replayed it); `PARTS` names a part by the first
function found on that stack, innermost first, and splits attention kernels from the rest by name.
A part's time is the union of its events' intervals, not their sum: with programmatic dependent
launch a kernel starts while the one before it still runs and waits inside (the merge after the
prefix kernel), so durations overlap. Per-step figures divide by the rounds the trace holds (the
outermost `forward_batch_generation` of the DDTree or DFlash v2 worker). What the GPU did not account
for in a step (host work, launch and sync gaps) is the unprofiled step time less the GPU's busy time:
report.py computes it from the bench's TPOT. `host_syncs` lists where the step's thread waited for the
GPU (a synchronize, or a copy to host memory), the calls a step cannot run ahead of.
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
    ("_greedy_sample_from_vocab_parallel_head", "draft head top-k"),  # DFlash's chain: its top-1
    ("build_ddtree_tree_gpu", "tree build"),
    ("build_ddtree_tree", "tree build"),
    ("compile_ddtree_tree", "mask build"),
    ("_accept_tree", "accept and sampling"),
    ("_compute_dflash_accept_bonus_triton_unchecked", "accept and sampling"),
    ("compute_dflash_correct_drafts_and_bonus", "accept and sampling"),
    ("compute_dflash_sampling_correct_drafts_and_bonus", "accept and sampling"),
    ("move_accept_tokens_to_target_kvcache", "KV move"),
    ("prepare_for_verify", "verify inputs"),
]
TARGET = "target verify"
STEP_FUNCTION = re.compile(r"(ddtree|dflash)_worker_v2\.py\(\d+\): forward_batch_generation$")
DRAFT_RUNNER = re.compile(r"model_runner\.py\(\d+\): forward$")  # DFlash's chain calls its drafter's runner directly
TARGET_FUNCTION = "forward_batch_generation"  # the target worker's, inside the DDTree step
ATTENTION = re.compile(r"tree_block|prefix_\w*kernel|merge_parts|_fwd_kernel|_fwd_grouped_kernel|extend_attention|"
                       r"decode_att|attention|sparse_mla", re.IGNORECASE)
# A DSA target's key selection: our index logits and top-k (ddtree_kernels.dsa), and SGLang's index-key
# quantization and store; the indexer's projections are GEMMs and stay in "rest of the model".
INDEXER = re.compile(r"dsa_index_logits|dsa_topk|act_quant|store_indexer_cache|set_k_and_s|indexer_k|hadamard",
                     re.IGNORECASE)
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
        if INDEXER.search(kernel):
            return "target verify indexer and top-k"
        return "target verify attention" if ATTENTION.search(kernel) else "target verify (rest of the model)"
    if any(DRAFT_RUNNER.search(n) for n in stack[step_depth + 1:]):
        return "drafter attention" if ATTENTION.search(kernel) else "drafter (rest of the model)"
    return "step bookkeeping"


def _steps(events: list[dict]) -> list[dict]:
    """The outermost step calls (DDTree's step calls DFlash's for prefill and idle batches)."""
    calls = sorted((e for e in events if e.get("cat") == "python_function" and e.get("ph") == "X"
                    and STEP_FUNCTION.search(e.get("name", ""))), key=lambda e: (float(e["ts"]), -float(e["dur"])))
    out, end = [], float("-inf")
    for e in calls:
        if float(e["ts"]) >= end:
            out.append(e)
            end = float(e["ts"]) + float(e["dur"])
    return out


# Runtime calls after which the host thread has waited for the GPU; a copy waits when it lands in host memory.
SYNC_CALL = re.compile(r"Synchronize|^cudaMemcpy$|^cuMemcpyDtoH")
COPY_CALL = re.compile(r"^cudaMemcpyAsync$|^cuMemcpyAsync")


def _caller(stack: list[str]) -> str:
    """The innermost SGLang frame of a stack, as 'file.py: function' (the call a sync is charged to)."""
    for name in reversed(stack):
        if "sglang/" in name:
            file, _, fn = name.partition(": ")
            return f"{file.rsplit('/', 1)[-1].split('(')[0]}: {fn}"
    return _function(stack[-1]) if stack else "?"


def host_syncs(events: list[dict]) -> dict:
    """Where a step's thread waited for the GPU: per step, how many waits and how long the host sat in
    them, and by SGLang function (the innermost on the stack). A wait is a synchronize call, or a copy
    whose GPU side is device-to-host (the host cannot go on before the bytes land)."""
    steps = _steps(events)
    if not steps:
        return {"per_step": 0.0, "wait_ms_per_step": 0.0, "by_caller": {}}
    d2h = {e.get("args", {}).get("correlation") for e in events
           if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")}
    waits = []
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver") or e.get("ph") != "X":
            continue
        name = e.get("name", "")
        if SYNC_CALL.search(name) or (COPY_CALL.search(name) and e.get("args", {}).get("correlation") in d2h):
            t = float(e["ts"])
            if any(float(s["ts"]) <= t <= float(s["ts"]) + float(s["dur"]) and s["tid"] == e["tid"] for s in steps):
                waits.append(e)
    stacks = _stacks(events, [(float(e["ts"]), (e["pid"], e["tid"])) for e in waits])
    by: dict[str, list[float]] = defaultdict(list)
    for e in waits:
        by[_caller(stacks.get((float(e["ts"]), (e["pid"], e["tid"])), []))].append(float(e.get("dur", 0)) / 1e3)
    n = len(steps)
    return {"per_step": len(waits) / n, "wait_ms_per_step": sum(sum(v) for v in by.values()) / n,
            "by_caller": {k: {"per_step": len(v) / n, "wait_ms_per_step": sum(v) / n}
                          for k, v in sorted(by.items(), key=lambda kv: -sum(kv[1]))}}


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
        if "attention" in part or "indexer" in part:
            kernels[part][e.get("name", "?")[:80]].append(span)
    step_calls = _steps(events)
    steps = len(step_calls)
    wall = [float(e["dur"]) / 1e3 for e in step_calls]
    n = max(steps, 1)
    parts = {k: _union_ms(v) / n for k, v in intervals.items()}
    return {
        "steps": steps,
        "parts_ms": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
        "gpu_busy_ms": _union_ms(everything) / n,
        "attention_kernels_ms": {p: {k: _union_ms(v) / n for k, v in ks.items()} for p, ks in kernels.items()},
        "profiled_step_wall_ms": sum(wall) / n if wall else None,
        "host_syncs": host_syncs(events),
    }
