"""Time the DSA tree verify's kernels one by one, for tile variants, inside replayed CUDA graphs.

    python -m ddtree_tools.sweep_dsa --emulate sm120 --case 1x185000 --indexer 16x128x4x3x2 --indexer 8x128x4x3x3
    python -m ddtree_tools.sweep_dsa --emulate sm120 --case 1x65536 --collect 1x2048x4x1x8 --resolve 1x4096x8x1
    python -m ddtree_tools.sweep_dsa --emulate sm120 --case 1x185000 --attention 16x16x4x2

A tile is MxNxWARPSxSTAGES[xPROGRAMS_PER_SM] (programs an SM set the split count). Each variant is the target's
DSA_TABLES entry with that one tile replaced (`--collect` sets the histogram pass's grid and step too); the shipped
entry is timed first. Per case it prints the indexer alone, the top-k's passes apart (the histogram with the state's
memset; collect as histogram and collect replayed together less the histogram; the resolve alone, over the state
and candidates a whole top-k left), the sparse
attention with its merge, and the whole call, each the median of a replayed graph over rotated pools
(bench_dsa.DSAProblem, the benchmark's inputs). A variant times its own kernel and the whole call. `--json PATH`
writes every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch
import triton

from ddtree_kernels.dsa import DSAWorkspace, plan_dsa_verify
from ddtree_kernels.dsa.launcher import DSATiles, dsa_tiles
from ddtree_kernels.plan_types import Tile
from ddtree_kernels.target import Target

from .bench import EMULATIONS, enable_emulation, time_in_graphs
from .bench_dsa import D_V, DRAFT, HEADS, DSAProblem

TILE_FORM = "MxNxWARPSxSTAGES[xPROGRAMS_PER_SM]"
GROUPS = ("indexer", "histogram", "collect", "resolve", "attention", "call")  # what time_kernels can time
_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "programs_per_sm")
KERNEL_TILES = {"indexer": "indexer", "collect": "topk", "resolve": "topk_resolve",  # option -> DSATiles field
                "attention": "attention"}


def parse_tile(text: str, kernel: str) -> Tile:
    """A tile of `kernel` from its spec: each number names a Tile field by its place (programs an SM default 1)."""
    try:
        numbers = [int(x) for x in text.lower().split("x")]
    except ValueError:
        numbers = []
    if not 4 <= len(numbers) <= 5 or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"tile {text!r}: write {TILE_FORM} with positive numbers, e.g. 16x64x4x2x4")
    return Tile(kernel, **dict(zip(_FIELDS[: len(numbers)], numbers, strict=True)))


def label(tile: Tile) -> str:
    return f"{tile.block_m}x{tile.block_n}x{tile.num_warps}x{tile.num_stages}x{tile.programs_per_sm}"


def variants(base: DSATiles, args) -> list[tuple[str, DSATiles]]:
    """(what changed, tiles): the base first, then each option's tiles with the base's other kernels."""
    out = [("default", base)]
    for option, field in KERNEL_TILES.items():
        for tile in getattr(args, option) or []:
            tile = dataclasses.replace(tile, kernel=getattr(base, field).kernel)
            out.append((f"{option} {label(tile)}", dataclasses.replace(base, name=f"{base.name}-sweep",
                                                                       **{field: tile})))
    return out


def time_kernels(p: DSAProblem, tiles: DSATiles, target: Target, which: set[str]) -> dict[str, float]:
    """Median µs of each kernel group asked for (`which` of indexer, histogram, collect, resolve, attention, call)."""
    plan = plan_dsa_verify(p.bs, HEADS, DRAFT, p.T, p.L, target, tiles=tiles)
    ws = DSAWorkspace(plan, "cuda")
    out = torch.empty(p.T, HEADS, D_V, dtype=torch.bfloat16, device="cuda")
    for pool in p.pools:  # every pool's state exists before a stage runs alone
        p.dsa_call(plan, ws, out, pool)()

    def timed(stages: tuple[str, ...]) -> float:
        return time_in_graphs([p.dsa_call(plan, ws, out, pool, stages) for pool in p.pools])

    got = {"splits": f"index {plan.index_splits}, collect {plan.topk_splits}, attention {plan.attention_splits}"}
    if "indexer" in which:
        got["indexer"] = timed(("indexer",))
    if {"histogram", "collect", "resolve"} & which:
        got["histogram"] = timed(("topk_histogram",))
        # one replay less one replay: each carries its own fixed cost, which two subtractions would take off twice
        got["collect"] = timed(("topk_histogram", "topk_collect")) - got["histogram"]
        # the resolve alone reads the state and candidates a whole top-k left (the histogram's memset clears them)
        p.dsa_call(plan, ws, out, p.pools[-1], ("topk",))()
        got["resolve"] = timed(("topk_resolve",))
    if "attention" in which:
        got["attention"] = timed(("attention",))
    if "call" in which:
        got["call"] = timed(("indexer", "topk", "attention"))
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emulate", choices=sorted(EMULATIONS), help="time another GPU's kernel path here (sm120)")
    ap.add_argument("--case", action="append", required=True, help="BSxCONTEXT, e.g. 1x185000 (repeat)")
    for option in KERNEL_TILES:
        ap.add_argument(f"--{option}", action="append", type=lambda t, o=option: parse_tile(t, o),
                        help=f"a {option} tile, {TILE_FORM} (repeat)")
    ap.add_argument("--kernels", default=",".join(GROUPS), type=lambda t: t.split(","),
                    help="which of %(default)s the shipped entry's row times (default all)")
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args(argv)
    if unknown := set(args.kernels) - set(GROUPS):
        ap.error(f"--kernels {','.join(sorted(unknown))}: choose from {','.join(GROUPS)}")
    if not torch.cuda.is_available():
        print("sweep_dsa needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.emulate:
        enable_emulation(args.emulate, "cuda")
    target = Target.emulating(args.emulate, "cuda") if args.emulate else Target.detect("cuda")
    base = dsa_tiles(target)
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}, "
          f"{'sm_120 emulation' if args.emulate else 'native'}: µs a call, one replayed graph each", flush=True)
    rows = []
    for spec in args.case:
        bs, L = (int(x) for x in spec.lower().split("x"))
        p = DSAProblem(bs, L, "cuda")
        for name, tiles in variants(base, args):
            which = set(args.kernels) if name == "default" else {name.split()[0], "call"}
            try:
                got = time_kernels(p, tiles, target, which)
            except Exception as exc:  # a tile that does not compile or fit is a result, not a crash
                print(f"bs{bs} L{L:<7} {name:<32} {type(exc).__name__}: {str(exc).splitlines()[0][:100]}", flush=True)
                continue
            rows.append({"batch": bs, "context": L, "variant": name, **got})
            times = "  ".join(f"{k} {v:7.1f}" for k, v in got.items() if k != "splits")
            print(f"bs{bs} L{L:<7} {name:<32} {times}  ({got['splits']})", flush=True)
        del p
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "emulate": args.emulate, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
