"""Time prefix tiles against verify shapes, inside replayed CUDA graphs.

    python -m ddtree_tools.sweep --tile 16x32x4x3 --tile 32x32x4x3 --case 1,185000,8,9 --case 1,185000,8,1
    python -m ddtree_tools.sweep --tile 16x32x8x3x1+keys_major --case 1,185000,8,9 --fp8 --merge 64x32 --merge 32x128
    python -m ddtree_tools.sweep --tile 16x32x4x3x2 --wide 64x64x8x2x1 --tail-max 32 --case 1,185000,8,9 --splits 86
    python -m ddtree_tools.sweep --tile 16x32x4x3x2 --wide 64x64x8x2x1+wgmma --tail-max 32 \
        --gluon-tail 8 --gluon-tail 0 --case 1,185000,8,9
    python -m ddtree_tools.sweep --emulate sm120 --tile 32x32x8x2x1+latent_split --case 1,185000,8,9
    python -m ddtree_tools.sweep --tile 16x32x4x3x2 --gluon-narrow 8x64x8x3 --case 1,185000,8,1

A tile is BLOCK_M x BLOCK_N x warps x stages [x programs resident per SM, default 2: it sets the
split count], then, each after a `+`, the kernel that runs it (general: prefix_general.py, the
default; chunked and latent_split: sm120/; wgmma: hopper/prefix_wgmma.py) and keys_major (keys-major
scores, values gathered apart). The tiles become a rule table (`sweep_table`) planned for this GPU, or
with --emulate sm120 for sm_120 on this GPU (bench.py's emulation). A case is bs,L,H,n; a merge is a
budget of output columns x parts a program (the launcher trades columns for parts); --wide adds a tile
for requests of at least its rows, with a row tail of up to --tail-max rows on --tile in a second
launch; --gluon-tail caps the rows a wgmma wide tile's blocks take past 64 each; --gluon-narrow gives
requests of at most its rows the wgmma tile's keys-major form.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch
import triton

from ddtree_kernels.launcher import Workspace, plan_verify
from ddtree_kernels.plan_types import Rule, RuleTable, Tile
from ddtree_kernels.sm120.rules import SM120
from ddtree_kernels.target import Target

from .bench import EMULATIONS, Case, Problem, ceilings, enable_emulation, time_in_graphs


def sweep_table(tile: Tile, *, min_chunk: int | None = None, merge: tuple[int, int] | None = None,
                prefetch_slots: bool = True, pdl: bool = True, wide: Tile | None = None, tail_max: int = 0,
                gluon_tail: int | None = None, gluon_narrow: Tile | None = None, wide_min_rows: int | None = None,
                tail_partition: bool = False) -> RuleTable:
    """A rule table of the tiles given: `tile` serves every request unless `wide` is given; then `wide` takes
    requests of at least `wide_min_rows` rows (default: its block), with a row tail of up to `tail_max` rows on
    `tile` in a second launch, or up to `gluon_tail` rows a block (default 8) spread over a wgmma wide tile's
    blocks (`tail_partition`: on a warpgroup of their own). `gluon_narrow` takes requests of at most its rows."""
    rules = []
    if gluon_narrow is not None:
        rules.append(Rule("any", "in keys", (1, gluon_narrow.block_m), gluon_narrow))
    if wide is not None:
        if tail_partition:
            wide = dataclasses.replace(wide, options=(("tail_partition", True),))
        rules.append(Rule("any", "any", (wide_min_rows or wide.block_m, None), wide,
                          tail=tile if tail_max else None, tail_max_rows=tail_max,
                          fused_tail_max_rows=8 if gluon_tail is None else gluon_tail))
    rules.append(Rule("any", "any", (1, None), tile))
    table = dataclasses.replace(SM120, name="sweep", rules=tuple(rules), min_chunk=min_chunk or SM120.min_chunk,
                                prefetch_slots=prefetch_slots, pdl=pdl)
    if merge:
        table = dataclasses.replace(table, merge_block_d=merge[0], merge_block_s=merge[1])
    return table


def time_config(case: Case, table: RuleTable, target: Target, device: str = "cuda",
                splits: int | None = None) -> tuple[float, int]:
    """Median µs of one verify call in a replayed CUDA graph (pools rotated), and the split count."""
    p = Problem(case, device)
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, target, table=table, kv_fp8=case.fp8, num_splits=splits)
    ws = Workspace.for_plan(plan, device)
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device=device)
    us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
    return us, plan.num_splits


TILE_FORM = "MxNxWARPSxSTAGES[xPROGRAMS_PER_SM][+KERNEL][+keys_major]"
_SHAPE_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "programs_per_sm")
# Kernels a sweep tile can name (registry entries a rule may choose); prefix_general without one.
_KERNELS = {"general": "prefix_general", "chunked": "prefix_chunked", "latent_split": "prefix_latent_split",
            "latent_split_fp8": "prefix_latent_split_fp8", "latent_split_e4m3": "prefix_latent_split_e4m3",
            "wgmma": "hopper_wgmma"}


def _tile(text: str) -> Tile:
    """A tile from its spec: each number names a Tile field by its place, each switch by name (a new Tile field
    cannot silently change what a recorded command means)."""
    shape, *switches = text.lower().split("+")
    try:
        numbers = [int(x) for x in shape.split("x")]
    except ValueError:
        numbers = []
    if not 4 <= len(numbers) <= 5:
        raise argparse.ArgumentTypeError(f"tile {text!r}: write {TILE_FORM}, e.g. 32x32x8x2x1+latent_split")
    unknown = sorted(set(switches) - set(_KERNELS) - {"keys_major"})
    kernels = [s for s in switches if s in _KERNELS]
    if unknown or len(kernels) > 1:
        raise argparse.ArgumentTypeError(
            f"tile {text!r}: unknown switch {', '.join(unknown) or '(two kernels)'}: name at most one kernel "
            f"({', '.join(_KERNELS)}) and keys_major")
    fields = dict(zip(_SHAPE_FIELDS[: len(numbers)], numbers, strict=True))
    fields.setdefault("programs_per_sm", 2)  # the sweep's default: two programs an SM
    return Tile(_KERNELS[kernels[0]] if kernels else "prefix_general", keys_major="keys_major" in switches, **fields)


def _label(tile: Tile) -> str:
    kernel = next((k for k, v in _KERNELS.items() if v == tile.kernel), tile.kernel)
    return (f"{tile.block_m}x{tile.block_n}x{tile.num_warps}x{tile.num_stages}x{tile.programs_per_sm}"
            f" {kernel}{' keys-major' if tile.keys_major else ''}")


def _merge(text: str) -> tuple[int, int]:
    d, s = (int(x) for x in text.lower().split("x"))
    return d, s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tile", action="append", type=_tile, required=True,
                    help=TILE_FORM + ": shape, then the kernel (" + ", ".join(_KERNELS) + ") and keys_major")
    ap.add_argument("--emulate", choices=sorted(EMULATIONS), help="time another GPU's kernel path here (sm120)")
    ap.add_argument("--case", action="append", required=True, help="bs,L,H,n")
    ap.add_argument("--fp8", action="store_true", help="fp8_e4m3 KV cache")
    ap.add_argument("--min-chunk", type=int, action="append", help="fewest keys a split takes (repeat to compare)")
    ap.add_argument("--no-prefetch", action="store_true", help="also time without the L2 prefetch of slot indices")
    ap.add_argument("--wide", type=_tile, help="a wide tile for requests of at least its rows (with --tile)")
    ap.add_argument("--tail-max", type=int, action="append",
                    help="with --wide: row tails up to this many go to --tile in a second launch (repeat)")
    ap.add_argument("--splits", type=int, action="append", help="prefix splits instead of the planner's (repeat)")
    ap.add_argument("--gluon-tail", type=int, action="append",
                    help="with a Gluon --wide tile: tail rows each block takes past 64, at most (repeat; 0: never)")
    ap.add_argument("--gluon-narrow", type=_tile,
                    help="MxNxWARPSxSTAGES: the wgmma tile's keys-major form for requests of at most M rows")
    ap.add_argument("--wide-min-rows", type=int, help="with --wide: the fewest rows a request takes it with")
    ap.add_argument("--tail-partition", type=int, action="append", choices=(0, 1),
                    help="with a Gluon --wide tile: 1 runs its row tail on a warpgroup of its own (repeat to compare)")
    ap.add_argument("--no-pdl", action="store_true", help="also time without programmatic dependent launch")
    ap.add_argument("--merge", type=_merge, action="append", help="merge program: DxS columns x parts (repeat)")
    args = ap.parse_args(argv)
    narrow = (dataclasses.replace(args.gluon_narrow, kernel="hopper_wgmma", programs_per_sm=1, keys_major=True)
              if args.gluon_narrow else None)
    emulation = enable_emulation(args.emulate, "cuda") if args.emulate else {}
    target = Target.emulating(args.emulate, "cuda") if args.emulate else Target.detect("cuda")
    copy, mm = ceilings("cuda")
    mm = emulation.get("mma_tflops", mm)  # under emulation the compute floor is mma.sync's
    # The package's path too: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH,
    # so a copy of the package named there is not what runs from inside kernels/.
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s, matmul {mm:.0f} TFLOP/s, Triton {triton.__version__}"
          f", {__package__} from {os.path.dirname(os.path.abspath(__file__))}")
    for spec in args.case:
        case = Case(*(int(x) for x in spec.split(",")), fp8=args.fp8)
        floor = max(case.kv_bytes() / copy / 1e3, case.flops() / mm / 1e6)
        runs = [(t, c, m, pf, pdl, tail, splits, gt, tp) for t in args.tile for c in (args.min_chunk or [None])
                for m in (args.merge or [None]) for pf in ((True, False) if args.no_prefetch else (True,))
                for pdl in ((True, False) if args.no_pdl else (True,)) for tail in (args.tail_max or [0])
                for splits in (args.splits or [None]) for gt in (args.gluon_tail or [None])
                for tp in (args.tail_partition or [0])]
        for tile, chunk, merge, prefetch, pdl, tail, splits, gluon_tail, tail_part in runs:
            try:
                table = sweep_table(tile, min_chunk=chunk, merge=merge, prefetch_slots=prefetch, pdl=pdl,
                                    wide=args.wide, tail_max=tail, gluon_tail=gluon_tail, gluon_narrow=narrow,
                                    wide_min_rows=args.wide_min_rows, tail_partition=bool(tail_part))
                us, splits = time_config(case, table, target, splits=splits)
                merge = merge or (SM120.merge_block_d, SM120.merge_block_s)
                print(f"{case.label:26} {_label(tile):<13} chunk {chunk or SM120.min_chunk:<5} "
                      f"merge {merge[0]}x{merge[1]:<4}"
                      f"{'' if prefetch else ' no-prefetch'}{'' if pdl else ' no-pdl'}"
                      f"{f' wide {_label(args.wide)} tail<={tail}' if args.wide else ''}"
                      f"{f' from {args.wide_min_rows} rows' if args.wide_min_rows else ''}"
                      f"{f' fused<={gluon_tail}' if gluon_tail is not None else ''}"
                      f"{f' narrow {_label(narrow)}' if narrow else ''}"
                      f"{' tail-partition' if tail_part else ''}"
                      f"{us:9.1f} µs  {case.kv_bytes() / us / 1e3:6.0f} GB/s  {floor / us:5.1%} of floor  "
                      f"splits {splits}", flush=True)
            except Exception as exc:  # a tile that does not compile or fit is a result, not a crash
                wide = f" wide {_label(args.wide)}" if args.wide else ""
                print(f"{case.label:26} {_label(tile)}{wide}: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
