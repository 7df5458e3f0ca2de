"""Session 12: graph time and error against the float64 reference of one verify call per case, for two or
more copies of ddtree_kernels loaded side by side in one process and timed case by case in turn (A, B, ...,
A), so drift between them stays small. Written to compare launch orders (`tree_after_prefix.patch`), with
each copy's correctness checked in the same run; session 13 timed every variant it tried this way.

    cd kernels && python3 results/probes/order_check.py head=ddtree_kernels tap=../scratch/tap/ddtree_kernels \
        [bs,L,H,n ...]
"""
import importlib.util
import sys
from pathlib import Path

import torch


def load(name: str, folder: str):
    """Import the package in `folder` under the top-level name `name` (its imports are all relative)."""
    spec = importlib.util.spec_from_file_location(name, Path(folder) / "__init__.py",
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.bench")


copies = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
benches = {tag: load(f"copy_{tag}", folder) for tag, folder in copies.items()}
Case = next(iter(benches.values())).Case
cases = [Case(*(int(x) for x in a.split(","))) for a in sys.argv[1:] if "=" not in a] or [
    Case(1, 185000, 8, 9), Case(1, 131072, 8, 9), Case(1, 65536, 8, 9), Case(1, 185000, 8, 33),
    Case(4, 65536, 8, 9), Case(1, 8192, 8, 9)]
order = list(benches) + list(benches)[:1]
for case in cases:
    for tag in order:
        bench = benches[tag]
        row = bench.measure(bench.Case(**vars(case)), "cuda", 1.0, 1.0, None)  # ceilings unused here
        print(f"{tag:6} {case.label:22} graph {row.ours_graph_us:7.1f} us  eager {row.ours_us:7.1f} us  "
              f"err {row.err_vs_reference:.1e}", flush=True)
        torch.cuda.empty_cache()
