"""Session 13: whole-call graph time and error against the float64 reference with the merge launched in other
shapes: (columns a program, parts a step, warps). The shipped rule (launcher.merge_tile) takes every part in one
step; the stamps (`stamps_timeline.py`) show the merge's 1,152 GLM-5 programs passing their grid wait over ~5 µs
after the prefix kernel ends, as they become resident. Fewer, wider programs: does the call end sooner?

    cd kernels && PYTHONPATH=. python3 results/probes/merge_shapes.py [D,S,W ...]
"""
import dataclasses
import sys

import torch

from ddtree_kernels import configs, launcher
from ddtree_kernels.bench import Case, measure

shapes = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or [
    (32, 256, 4), (64, 256, 8), (128, 256, 16), (16, 256, 2), (32, 256, 8), (64, 256, 4)]
cases = [Case(1, 65536, 8, 9), Case(1, 131072, 8, 9), Case(1, 185000, 8, 9), Case(1, 8192, 8, 9),
         Case(1, 185000, 8, 1)]
shipped = configs.BY_CAPABILITY[(9, 0)]
original_tile = launcher.merge_tile
for case in cases:
    for d, s, w in shapes:
        configs.BY_CAPABILITY[(9, 0)] = dataclasses.replace(shipped, merge_num_warps=w)
        launcher.merge_tile = lambda conf, parts, d=d, s=s: (d, s)
        row = measure(case, "cuda", 1.0, 1.0, None)  # ceilings unused here
        print(f"{case.label:22} merge {d:3}x{s:3} {w:2} warps  graph {row.ours_graph_us:7.1f} us  "
              f"err {row.err_vs_reference:.1e}", flush=True)
        torch.cuda.empty_cache()
configs.BY_CAPABILITY[(9, 0)], launcher.merge_tile = shipped, original_tile
