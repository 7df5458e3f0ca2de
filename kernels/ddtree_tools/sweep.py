"""Time prefix-tile configurations against verify shapes, inside replayed CUDA graphs.

    python -m ddtree_tools.sweep --tile 16x32x4x3 --tile 32x32x4x3 --case 1,185000,8,9 --case 1,185000,8,1
    python -m ddtree_tools.sweep --tile 16x32x8x3x1 --case 1,185000,8,9 --fp8 --merge 64x32 --merge 32x128
    python -m ddtree_tools.sweep --tile 16x32x4x3x2 --wide 64x64x8x2x1 --tail-max 32 --case 1,185000,8,9 --splits 86
    python -m ddtree_tools.sweep --tile 16x32x4x3x2 --wide 64x64x8x2x1+gluon --tail-max 32 \
        --gluon-tail 8 --gluon-tail 0 --case 1,185000,8,9
    python -m ddtree_tools.sweep --emulate sm120 --tile 32x32x8x2x1+mma_v2 --case 1,185000,8,9
    python -m ddtree_tools.sweep --tile 16x32x4x3x2 --gluon-narrow 8x64x8x3 --case 1,185000,8,1

A tile is BLOCK_M x BLOCK_N x warps x stages [x programs resident per SM, default 2: it sets
the split count], then TileConfig's kernel switches by name, each after a `+`: keys_major (keys-major
scores, values gathered apart), gluon (the Hopper wide tile, hopper/prefix.py), chunked
(prefix_chunked.py), mma_v2 (prefix_mma_v2.py's Gluon tile); --emulate sm120 times sm_120's kernel
path on this GPU (bench.py's emulation);
a case is bs,L,H,n; a merge is a budget of output columns x parts per program (the launcher
trades columns for parts); --wide adds a tile for requests of at least its rows,
with a row tail of up to --tail-max rows on --tile in a second launch (under --fp8, the fp8 wide
tile and its tail); --gluon-tail caps the rows a Gluon wide tile's blocks take past 64 each;
--gluon-narrow gives requests of at most its rows prefix_hopper's keys-major tile. This is
how the shipped configs in configs.py were chosen (kernels/results/sweep-h200.log, the tuning log).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch
import triton

from ddtree_kernels.configs import SM120, TileConfig
from ddtree_kernels.launcher import Workspace, plan_verify

from .bench import EMULATIONS, Case, Problem, ceilings, enable_emulation, time_in_graphs


def time_config(case: Case, tile: TileConfig, device: str = "cuda", min_chunk: int | None = None,
                merge: tuple[int, int] | None = None, prefetch_slots: bool = True,
                pdl: bool = True, wide: TileConfig | None = None, tail_max: int = 0,
                splits: int | None = None, gluon_tail: int | None = None,
                gluon_narrow: TileConfig | None = None, wide_min_rows: int | None = None,
                tail_partition: bool = False) -> tuple[float, int]:
    """Median µs of one verify call in a replayed CUDA graph (pools rotated), and the split count.
    `tile` serves every request unless `wide` is given: then `wide` takes requests of at least its
    row count, and a row tail of up to `tail_max` rows goes to `tile` in a second launch (or, up to
    `gluon_tail` rows a block, SM120's by default, spread over a Gluon wide tile's blocks).
    `gluon_narrow` takes requests of at most its rows where prefix_hopper's kernel runs; `wide_min_rows`
    (default: the wide tile's rows) is the fewest rows a request takes the wide tile with; `tail_partition`
    puts a Gluon wide tile's row tail on a warpgroup of its own (VerifyConfig.gluon_tail_partition)."""
    min_rows = (wide_min_rows or wide.block_m) if wide else 0  # one rule for both the Gluon and Triton wide tiles
    cfg = dataclasses.replace(SM120, prefix=tile, prefix_fp8=tile, prefix_wide=wide,
                              prefix_wide_fp8=wide if case.fp8 else None,
                              prefix_wide_fp8_gluon=wide if case.fp8 and wide and wide.gluon else None,
                              wide_min_rows=min_rows, gluon_wide_min_rows=min_rows, wide_tail_max_rows=tail_max,
                              min_chunk=min_chunk or SM120.min_chunk, prefetch_slots=prefetch_slots, pdl=pdl,
                              gluon_tail_max_rows=SM120.gluon_tail_max_rows if gluon_tail is None else gluon_tail,
                              prefix_narrow_gluon=gluon_narrow, prefix_narrow_fp8_gluon=gluon_narrow,
                              prefix_small=None, prefix_small_fp8=None,
                              gluon_tail_partition=tail_partition)
    if merge:
        cfg = dataclasses.replace(cfg, merge_block_d=merge[0], merge_block_s=merge[1])
    p = Problem(case, device)
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, device, config=cfg, kv_fp8=case.fp8, num_splits=splits)
    ws = Workspace.for_plan(plan, device)
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device=device)
    us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
    return us, plan.num_splits


TILE_FORM = "MxNxWARPSxSTAGES[xPROGRAMS_PER_SM][+SWITCH...]"


def _tile(text: str) -> TileConfig:
    """A tile from its spec: the shape positionally, the kernel switches by name (a new TileConfig field
    cannot silently change what a recorded command means)."""
    shape, *switches = text.lower().split("+")
    names = {f.name for f in dataclasses.fields(TileConfig) if f.type in (bool, "bool")}
    try:
        numbers = [int(x) for x in shape.split("x")]
    except ValueError:
        numbers = []
    if not 4 <= len(numbers) <= 5:
        raise argparse.ArgumentTypeError(f"tile {text!r}: write {TILE_FORM}, e.g. 32x32x8x2x1+mma_v2")
    unknown = sorted(set(switches) - names)
    if unknown:
        raise argparse.ArgumentTypeError(f"tile {text!r}: unknown switch {', '.join(unknown)} "
                                         f"(TileConfig has {', '.join(sorted(names))})")
    return TileConfig(*numbers, **dict.fromkeys(switches, True))


def _label(tile: TileConfig) -> str:
    return (f"{tile.block_m}x{tile.block_n}x{tile.num_warps}x{tile.num_stages}x{tile.ctas_per_sm}"
            f"{' keys-major' if tile.keys_major else ''}{' gluon' if tile.gluon else ''}"
            f"{' chunked' if tile.chunked else ''}{' mma_v2' if tile.mma_v2 else ''}")


def _merge(text: str) -> tuple[int, int]:
    d, s = (int(x) for x in text.lower().split("x"))
    return d, s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tile", action="append", type=_tile, required=True,
                    help=TILE_FORM + ": shape, then kernel switches (keys_major, gluon, chunked, mma_v2)")
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
                    help="MxNxWARPSxSTAGES: prefix_hopper's keys-major tile for requests of at most M rows")
    ap.add_argument("--wide-min-rows", type=int, help="with --wide: the fewest rows a request takes it with")
    ap.add_argument("--tail-partition", type=int, action="append", choices=(0, 1),
                    help="with a Gluon --wide tile: 1 runs its row tail on a warpgroup of its own (repeat to compare)")
    ap.add_argument("--no-pdl", action="store_true", help="also time without programmatic dependent launch")
    ap.add_argument("--merge", type=_merge, action="append", help="merge program: DxS columns x parts (repeat)")
    args = ap.parse_args(argv)
    narrow = (dataclasses.replace(args.gluon_narrow, ctas_per_sm=1, keys_major=True, gluon=True)
              if args.gluon_narrow else None)
    emulation = enable_emulation(args.emulate, "cuda") if args.emulate else {}
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
                us, splits = time_config(case, tile, min_chunk=chunk, merge=merge, prefetch_slots=prefetch, pdl=pdl,
                                         wide=args.wide, tail_max=tail, splits=splits, gluon_tail=gluon_tail,
                                         gluon_narrow=narrow, wide_min_rows=args.wide_min_rows,
                                         tail_partition=bool(tail_part))
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
