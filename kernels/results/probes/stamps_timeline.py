"""Session 13: where a verify call's fixed cost goes. %globaltimer stamps written by each program of the
tree kernel, the warp-specialized prefix kernel and the merge (`stamps.patch`, applied to a copy of the
package; `stamps-ac5511c.patch` for commit ac5511c's, which the session-13 (4) figures used), read after
one graph replay of one call with L2 flushed by a read first (as the bench), five replays, medians.
Times are µs from the tree kernel's first program start.

    mkdir -p scratch/stamp && cp -r kernels/ddtree_kernels scratch/stamp/ && \
        (cd scratch/stamp && patch -p2 < ../../kernels/results/probes/stamps.patch)
    cd kernels && PYTHONPATH=../scratch/stamp python3 results/probes/stamps_timeline.py [bs,L,H,n ...]

Prefix stamps per program (split): 0 entry, 1 queries in shared memory, 2 first key tile landed, 3 key loop
done, 4 block's part stored, 5 tail's part stored, 6 after the final grid-dependency wait; with
`stamps-ws15.patch` (session 15's kernel; the scorer writes 2-4) also 7, the value partition's half stored.
Apply it as above: copy kernels/ddtree_kernels to scratch/stamp15/, then
    (cd scratch/stamp15 && patch -p2 < ../../kernels/results/probes/stamps-ws15.patch) Tree: 0 entry,
1 end. Merge: 0 entry, 1 after its grid-dependency wait, 2 end. Timing only; bs 1 (stamp slots are per split).
"""
import statistics
import sys

import torch

from ddtree_kernels import launcher
from ddtree_kernels.bench import Case, Problem, _read_flush, time_in_graphs
from ddtree_kernels.launcher import Workspace, plan_verify

TREE, MERGE = 50000, 100000


def one_replay(graph: torch.cuda.CUDAGraph, stamps: torch.Tensor, flush: torch.Tensor) -> dict:
    stamps.zero_()
    torch.sum(flush, dim=0)  # L2 holds nothing of the call's and nothing dirty
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    s = stamps.cpu()
    t0 = s[TREE:MERGE][s[TREE:MERGE] > 0].min().item()

    def us(x: torch.Tensor) -> list[float]:
        return [(v - t0) / 1e3 for v in x[x > 0].tolist()]

    pre = s[:TREE].view(-1, 8)
    pre = pre[pre[:, 0] > 0]
    tree = s[TREE:MERGE].view(-1, 4)
    tree = tree[tree[:, 0] > 0]
    merge = s[MERGE:].view(-1, 4)
    merge = merge[merge[:, 0] > 0]
    out = {"programs": len(pre)}
    out["tree start max"] = max(us(tree[:, 0]))
    out["tree end max"] = max(us(tree[:, 1]))
    for k, name in enumerate(("entry", "queries", "first tile", "loop done", "block stored", "tail stored",
                              "after wait")):
        v = us(pre[:, k])
        out[f"prefix {name} min"], out[f"prefix {name} med"], out[f"prefix {name} max"] = (
            min(v), statistics.median(v), max(v))
    for k, name in enumerate(("entry", "waited", "end")):
        v = us(merge[:, k])
        out[f"merge {name} min"], out[f"merge {name} med"], out[f"merge {name} max"] = (
            min(v), statistics.median(v), max(v))
    if (pre[:, 7] > 0).any():  # stamps-ws15.patch: the value partition's half of the block's part stored
        v = us(pre[:, 7])
        out["prefix values stored min"], out["prefix values stored med"], out["prefix values stored max"] = (
            min(v), statistics.median(v), max(v))
    full = pre[(pre[:, :7] > 0).all(1)]  # programs with an empty chunk write no first-tile stamp
    d = (full[:, 1:7] - full[:, 0:6]).double() / 1e3
    for k, name in enumerate(("queries", "first tile", "key loop", "block store", "tail store", "final wait")):
        out[f"per program: {name} med"] = d[:, k].median().item()
    entries = pre[:, 0]
    out["timer step ns"] = (entries.unique().diff().min().item() if entries.unique().numel() > 1 else 0)
    return out


cases = [Case(*(int(x) for x in a.split(","))) for a in sys.argv[1:]] or [
    Case(1, 65536, 8, 9), Case(1, 131072, 8, 9), Case(1, 185000, 8, 9)]
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda").view(torch.int64)
with _read_flush():
    for case in cases:
        p = Problem(case, "cuda")
        T = case.bs * case.n
        plan = plan_verify(case.bs, case.H, case.n, T, "cuda")
        ws = Workspace.for_plan(plan, "cuda")
        out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
        stamps = torch.zeros(MERGE + 4 * plan.merge_grid[0][0] * plan.merge_grid[0][1], dtype=torch.int64,
                             device="cuda")
        launcher.STAMPS = stamps
        graph_us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
        p.run_ours(plan, ws, out, p.pools[0])
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            p.run_ours(plan, ws, out, p.pools[0])
        runs = [one_replay(g, stamps, flush) for _ in range(5)]
        print(f"{case.label}: graph {graph_us:.1f} µs (bench timing), splits {plan.num_splits}, "
              f"prefix programs {runs[0]['programs']}; µs from the first tree program, median of 5 replays")
        for key in runs[0]:
            if key != "programs":
                print(f"  {key:32} {statistics.median(r[key] for r in runs):8.2f}")
        del p
        torch.cuda.empty_cache()
