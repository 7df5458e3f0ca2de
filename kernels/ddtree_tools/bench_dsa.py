"""DSA tree verify beside the dense verify, on one GPU, in one run (BENCHMARKS.md, "DSA tree verify").

    python -m ddtree_tools.bench_dsa --emulate sm120 --out DIR     # the sm_120 path, projected to the RTX PRO 6000
    python -m ddtree_tools.bench_dsa --out DIR                     # this GPU's own path

GLM-5's verify (8 heads a GPU, a 9-token tree, top 2,048, 32 index heads) at bs 1 and 4 and 8k-185k: the copy
ceiling, the mma.sync ceiling (under --emulate), the dense verify (our kernel over the whole prefix, what serves
today) and the DSA verify over the same latent pool: the indexer, the top-k and the sparse attention each timed
alone and the three together, every time a replayed CUDA graph (several pools rotated so L2 does not hold them),
medians of device events (bench._time). Each stage's floor is max(bytes / copy, flops / compute ceiling):
indexer: the index keys (132 bytes a key) and the logits written, 2 * tokens * 32 * 128 flops a key on the
mma.sync ceiling (the fp8 dot runs as bf16 mma.sync on the H200 in emulation; sm_120 runs e4m3); top-k: one read
of the logits; attention: each token's 2,048 latent rows and its MMA flops. The RTX PRO 6000 projection keeps
each stage at the fraction of its floor reached here, with the RTX PRO 6000's floor (1,792 GB/s; 905 TFLOP/s
e4m3 for the indexer, 458 bf16 for the attention): a projection, labelled so. `rel_err` is the DSA output
against the float64 reference (ddtree_kernels.dsa.reference). Writes dsa.json (a figure a mode does not have, such as
the projection of a native run, is null), dsa.md and dsa.png.

Natively on Hopper the same run also times SGLang's own DSA stages for a TARGET_VERIFY on the same shapes
(`sglang_indexer_us`, `sglang_topk_us`): DeepGEMM's `fp8_paged_mqa_logits` (package sgl-deep-gemm, page size 64,
one row a draft token, next_n = 1, the schedule metadata made beforehand as SGLang's init_forward_metadata does) and
`sgl_kernel.fast_topk_transform_fused` (package sglang-kernel) over its logits, as
`Indexer._get_topk_paged` calls them in the ddtree-v2 snapshot. Token i of a request's tree sees L + i + 1 keys
there (a chain: SGLang has no tree mask in its indexer). `--sglang-stages DIR` names where sglang-kernel's Hopper
`common_ops.abi3.so` lies (its 383 MB wheel does not travel; the one library does); deep_gemm is imported as
installed. Where either cannot run, the columns are null and the reason is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton

from ddtree_kernels import masks
from ddtree_kernels.dsa import DSAWorkspace, act_quant, dsa_tree_verify_reference, plan_dsa_verify, run_dsa_verify
from ddtree_kernels.dsa.index_keys import INDEX_ROW_BYTES, new_index_buffer, write_index_keys
from ddtree_kernels.launcher import Workspace, plan_verify, run_verify
from ddtree_kernels.target import Target
from ddtree_kernels.tree import MASK_COMPACT

from .bench import RTX_PRO_6000, Case, ceilings, enable_emulation, projection, time_in_graphs

SGLANG_PAGE = 64  # DeepGEMM's paged logits and SGLang's DSA pool on CUDA

HEADS, DRAFT, TOPK, INDEX_HEADS = 8, 9, 2048, 32
CASES = [(bs, L) for bs in (1, 4) for L in (8192, 65536, 131072, 185000)]
D_QK, D_V = 576, 512


class DSAProblem:
    """One case's inputs: queries, a tree, index queries and gates, and several latent pools with their index keys
    and slot lists, rotated so L2 never holds the working set. Seeded by the case: the top-k's work depends on the
    logits (how many keys share the boundary bucket), so two processes, or two commits, time the same inputs."""

    def __init__(self, bs: int, L: int, device: str, l2_bytes: int = 50 << 20):
        self.bs, self.L = bs, L
        T, S = bs * DRAFT, bs * (L + DRAFT) + 4096
        self.T = T
        self.qo = (torch.arange(bs + 1, dtype=torch.int32) * DRAFT).to(device)
        self.kv = (torch.arange(bs + 1, dtype=torch.int32) * L).to(device)
        seed = bs * 1_000_003 + L
        cpu, gen = torch.Generator().manual_seed(seed), torch.Generator(device=device).manual_seed(seed)
        self.vis = masks.parents_to_visibility(masks.random_parents([DRAFT] * bs, cpu), self.qo.cpu(), DRAFT).to(device)
        self.q = torch.randn(T, HEADS, D_QK, device=device, dtype=torch.bfloat16, generator=gen)
        self.index_q, q_scale = act_quant(torch.randn(T, INDEX_HEADS, 128, device=device, generator=gen))
        gates = torch.randn(T, INDEX_HEADS, device=device, generator=gen)
        self.index_w = (gates * INDEX_HEADS**-0.5 * q_scale * 128**-0.5).float()
        pool_bytes = S * (D_QK * 2 + INDEX_ROW_BYTES)
        self.pools = []
        for _ in range(max(2, min(6, math.ceil(4 * l2_bytes / pool_bytes)))):
            k = torch.randn(S, 1, D_QK, device=device, generator=gen).to(torch.bfloat16)
            index_buf = new_index_buffer(S, device)
            index_keys = torch.randn(S, 128, device=device, generator=gen)
            write_index_keys(index_buf, torch.arange(S, device=device), index_keys)
            perm = torch.randperm(S, device=device, generator=gen)
            slots, tree_slots = perm[: bs * L], perm[bs * L: bs * L + T]
            self.pools.append((k, index_buf, slots, tree_slots))

    def dsa_call(self, plan, ws, out, pool, stages=("indexer", "topk", "attention")):
        k, index_buf, slots, tree_slots = pool
        return lambda: run_dsa_verify(plan, ws, self.q, k, self.kv, slots, self.qo, tree_slots, self.vis,
                                      self.index_q, self.index_w, index_buf, out, sm_scale=1 / 16, stages=stages)

    def dense_call(self, plan, ws, out, pool):
        k, _, slots, tree_slots = pool
        k_tree = k[tree_slots]
        return lambda: run_verify(plan, ws, self.q, k, k[..., :D_V], self.kv, slots, k_tree, k_tree[..., :D_V],
                                  self.qo, out, mask_mode=MASK_COMPACT, mask=self.vis.view(torch.uint8),
                                  mask_indptr=None, mask_row_stride=DRAFT, sm_scale=1 / 16)

    def sglang_calls(self, pool, stages) -> tuple:
        """(indexer call, top-k call, {"out": the indexer's logits}) of SGLang's stages over this pool's keys, paged at
        64 as SGLang keeps them."""
        _, index_buf, slots, _ = pool
        bs, L, T, device = self.bs, self.L, self.T, self.index_q.device
        pages_a_request = -(-(L + DRAFT) // SGLANG_PAGE)
        pages = bs * pages_a_request
        # the request's keys in order (prefix slots, then the tree's), page by page: 64 keys' bytes, then their scales
        order = torch.randperm(pages, device=device)
        keys = torch.zeros(pages * SGLANG_PAGE, INDEX_ROW_BYTES, dtype=torch.uint8, device=device)
        for b in range(bs):
            src = torch.cat([slots[b * L:(b + 1) * L], slots[:DRAFT]])  # tree keys: any valid rows
            dst = (order[b * pages_a_request:(b + 1) * pages_a_request, None] * SGLANG_PAGE
                   + torch.arange(SGLANG_PAGE, device=device)).flatten()[: L + DRAFT]
            keys[dst] = index_buf[src]
        keys = keys.view(pages, SGLANG_PAGE, INDEX_ROW_BYTES)
        kv_fused = torch.cat([keys[..., :128].reshape(pages, -1), keys[..., 128:].reshape(pages, -1)], 1)
        kv_fused = kv_fused.view(pages, SGLANG_PAGE, 1, INDEX_ROW_BYTES)
        tables = order.view(bs, pages_a_request).to(torch.int32)
        block_tables = tables.repeat_interleave(DRAFT, 0).contiguous()  # a row a draft token
        ctx = (L + 1 + torch.arange(DRAFT, device=device, dtype=torch.int32)).repeat(bs).view(T, 1)
        max_seq_len = pages_a_request * SGLANG_PAGE
        schedule = stages.deep_gemm.get_paged_mqa_logits_metadata(ctx, SGLANG_PAGE, stages.sms)
        q4 = self.index_q.unsqueeze(1)
        logits = {}

        def indexer():
            logits["out"] = stages.deep_gemm.fp8_paged_mqa_logits(q4, kv_fused, self.index_w, ctx, block_tables,
                                                                  schedule, max_seq_len, clean_logits=False)

        indexer()
        score = logits["out"]
        page_table_1 = torch.cat([slots[b * L:(b + 1) * L].view(1, L) for b in range(bs)]).to(torch.int32)
        page_table_1 = torch.nn.functional.pad(page_table_1, (0, max_seq_len - L)).contiguous()
        lengths = ctx.view(T).contiguous()
        cu_q = self.qo.to(torch.int32)
        dst = torch.empty(T, TOPK, dtype=torch.int32, device=device)

        def topk():
            stages.topk(score, lengths, dst, page_table_1, cu_q, None)

        return indexer, topk, logits

    def reference(self, pool) -> torch.Tensor:
        k, index_buf, slots, tree_slots = pool
        out, _ = dsa_tree_verify_reference(self.q, k, self.kv, slots, self.qo, tree_slots, self.vis, self.index_q,
                                           self.index_w, index_buf, topk=TOPK, sm_scale=1 / 16)
        return out


def stage_work(bs: int, L: int) -> dict[str, tuple[float, float, str]]:
    """(bytes, flops, compute peak name) a stage must move and do at least."""
    T, keys = bs * DRAFT, L + DRAFT
    selected = min(TOPK, keys)
    return {
        "indexer": (bs * keys * INDEX_ROW_BYTES + T * keys * 4, 2.0 * T * INDEX_HEADS * 128 * keys, "fp8_tflops"),
        "topk": (T * keys * 4, 0.0, "bf16_tflops"),
        "attention": (T * selected * D_QK * 2, 2.0 * T * HEADS * selected * (D_QK + D_V), "bf16_tflops"),
    }


def floor_us(nbytes: float, flops: float, gbs: float, tflops: float) -> float:
    return max(nbytes / gbs / 1e3, flops / tflops / 1e6)


class SGLangStages:
    """SGLang's DSA stages on Hopper: deep_gemm (as installed) and sglang-kernel's fast_topk_transform_fused (its
    Hopper ops library, loaded from `ops_dir` or an installed sgl_kernel). `reason` says why not, where not."""

    def __init__(self, ops_dir: str | None, device: str):
        self.reason = ""
        self.deep_gemm = self.topk = None
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        if torch.cuda.get_device_capability(device)[0] != 9:
            self.reason = "SGLang's DSA stages are timed on Hopper only (DeepGEMM's paged logits, sm_90 ops)"
            return
        try:
            import deep_gemm

            self.deep_gemm = deep_gemm
        except Exception as exc:  # any import failure is a reason to print, not a crash
            self.reason = f"no deep_gemm (pip package sgl-deep-gemm==0.1.4.post1): {type(exc).__name__}: {exc}"
            return
        try:
            self.topk = self._load_topk(ops_dir)
        except Exception as exc:  # (the same)
            self.reason = (f"no sgl_kernel fast_topk_transform_fused (sglang-kernel==0.4.5, sgl_kernel/sm90/"
                           f"common_ops.abi3.so): {type(exc).__name__}: {exc}")

    @staticmethod
    def _load_topk(ops_dir: str | None):
        if not hasattr(torch.ops.sgl_kernel, "fast_topk_transform_fused"):
            library = Path(ops_dir or "") / "common_ops.abi3.so"
            if ops_dir and library.exists():
                import importlib.util

                spec = importlib.util.spec_from_file_location("common_ops", str(library))
                spec.loader.exec_module(importlib.util.module_from_spec(spec))  # registers torch.ops.sgl_kernel
            else:
                import sgl_kernel  # noqa: F401
        return torch.ops.sgl_kernel.fast_topk_transform_fused

    @property
    def ok(self) -> bool:
        return not self.reason


def measure(bs: int, L: int, device: str, target: Target, copy: float, mma: float, emulated: bool,
            with_reference: bool, sglang: SGLangStages | None = None) -> dict:
    p = DSAProblem(bs, L, device)
    plan = plan_dsa_verify(bs, HEADS, DRAFT, p.T, L, target)
    ws = DSAWorkspace(plan, device)
    out = torch.empty(p.T, HEADS, D_V, dtype=torch.bfloat16, device=device)
    row: dict = {"batch": bs, "heads": HEADS, "draft": DRAFT, "context": L, "topk": TOPK}
    for pool in p.pools:  # every pool's workspace state exists before a stage runs alone
        p.dsa_call(plan, ws, out, pool)()
    row["dsa_us"] = time_in_graphs([p.dsa_call(plan, ws, out, pool) for pool in p.pools])
    for stage in ("indexer", "topk", "attention"):
        row[f"{stage}_us"] = time_in_graphs([p.dsa_call(plan, ws, out, pool, (stage,)) for pool in p.pools])
    row["sglang_indexer_us"] = row["sglang_topk_us"] = row["sglang_logits_rel"] = math.nan
    if sglang is not None and sglang.ok:
        try:
            calls = [p.sglang_calls(pool, sglang) for pool in p.pools]
            row["sglang_indexer_us"] = time_in_graphs([c[0] for c in calls])
            row["sglang_topk_us"] = time_in_graphs([c[1] for c in calls])
            # the same logits as ours over the prefix (the paged copy of the keys is right): relative difference
            p.dsa_call(plan, ws, out, p.pools[0], ("indexer",))()
            calls[0][0]()
            theirs = torch.cat([calls[0][2]["out"][b * DRAFT:(b + 1) * DRAFT, :L] for b in range(bs)])
            ours = torch.cat([ws.logits[b * DRAFT:(b + 1) * DRAFT, :L] for b in range(bs)])
            row["sglang_logits_rel"] = ((theirs - ours).norm() / ours.norm()).item()
            del calls
        except Exception as exc:  # one case fails alone: its columns stay null
            print(f"  SGLang's stages failed at bs{bs} L{L}: {type(exc).__name__}: {exc}", flush=True)
    dense_plan = plan_verify(bs, HEADS, DRAFT, p.T, target)
    dense_ws = Workspace.for_plan(dense_plan, device)
    dense_out = torch.empty_like(out)
    row["dense_us"] = time_in_graphs([p.dense_call(dense_plan, dense_ws, dense_out, pool) for pool in p.pools])
    projected, floors = 0.0, 0.0
    for stage, (nbytes, flops, peak) in stage_work(bs, L).items():
        here = floor_us(nbytes, flops, copy, mma)
        floors += here
        row[f"{stage}_floor_us"] = here
        rtx = floor_us(nbytes, flops, RTX_PRO_6000["gbs"], RTX_PRO_6000[peak])
        projected += row[f"{stage}_us"] * rtx / here
    row["dsa_floor_us"] = floors
    row["rtx_projected_us"] = projected if emulated else math.nan
    row["dense_rtx_projected_us"] = (projection(Case(bs, L, HEADS, DRAFT), row["dense_us"], mma)
                                     if emulated else math.nan)
    row["rel_err"] = math.nan
    if with_reference:
        p.dsa_call(plan, ws, out, p.pools[0])()
        ref = p.reference(p.pools[0])
        got = out.double().cpu()
        row["rel_err"] = ((got - ref).norm() / ref.norm()).item()
    row["speedup_vs_dense"] = row["dense_us"] / row["dsa_us"]
    return row


def _nulls(row: dict) -> dict:
    """NaN (a figure this mode does not have) as JSON null."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def markdown(rows: list[dict], meta: dict) -> str:
    emulated = meta.get("emulate")
    sgl = any(not math.isnan(r.get("sglang_indexer_us", math.nan)) for r in rows)
    lines = [f"DSA tree verify vs the dense verify, {meta['device']} ({meta['date']}, torch {meta['torch']}, Triton "
             f"{meta['triton']}){', sm_120 emulation' if emulated else ''}: GLM-5 (8 heads, 9-token tree, top "
             f"{TOPK} of the prefix and the tree), µs a layer, CUDA-graph replays.", "",
             "| bs | context | dense | DSA | indexer | top-k | attention | DSA floor | x dense | rel err"
             + (" | RTX PRO 6000 DSA (projected) | RTX PRO 6000 dense (projected) |" if emulated else " |"),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if emulated else "")]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['context']:,} | {r['dense_us']:.1f} | {r['dsa_us']:.1f} | "
                     f"{r['indexer_us']:.1f} | {r['topk_us']:.1f} | {r['attention_us']:.1f} | "
                     f"{r['dsa_floor_us']:.1f} | {r['speedup_vs_dense']:.2f} | {r['rel_err']:.1e}"
                     + (f" | {r['rtx_projected_us']:.1f} | {r['dense_rtx_projected_us']:.1f} |" if emulated else " |"))
    if sgl:
        lines += ["", "SGLang's own stages on the same shapes, same run (DeepGEMM fp8_paged_mqa_logits, page 64, a row "
                  "a draft token; sgl_kernel fast_topk_transform_fused), µs:", "",
                  "| bs | context | SGLang indexer | SGLang top-k | ours indexer | ours top-k | x (indexer + top-k) |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            theirs = r["sglang_indexer_us"] + r["sglang_topk_us"]
            lines.append(f"| {r['batch']} | {r['context']:,} | {r['sglang_indexer_us']:.1f} | {r['sglang_topk_us']:.1f}"
                         f" | {r['indexer_us']:.1f} | {r['topk_us']:.1f} | "
                         f"{theirs / (r['indexer_us'] + r['topk_us']):.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for bs, style in ((1, "-"), (4, "--")):
        sel = [r for r in rows if r["batch"] == bs]
        if not sel:
            continue
        x = [r["context"] / 1000 for r in sel]
        for key, label in (("dense_us", "dense verify"), ("dsa_us", "DSA verify"), ("indexer_us", "DSA indexer"),
                           ("topk_us", "DSA top-k"), ("attention_us", "DSA attention")):
            ax.plot(x, [r[key] for r in sel], style, marker="o", label=f"{label}, bs {bs}")
    ax.set_xlabel("context (thousand tokens)")
    ax.set_ylabel("µs a layer (CUDA-graph replay)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-dsa-out", help="folder for dsa.json, dsa.md, dsa.png (default %(default)s)")
    ap.add_argument("--emulate", choices=["sm120"], help="measure sm_120's path here, projected to the RTX PRO 6000")
    ap.add_argument("--cases", default=",".join(f"{bs}x{L}" for bs, L in CASES),
                    help="BSxCONTEXT,... (default %(default)s)")
    ap.add_argument("--no-reference", action="store_true", help="skip the float64 reference check")
    ap.add_argument("--reference-cases", default=None,
                    help="BSxCONTEXT,... to check against the float64 reference (default: every case)")
    ap.add_argument("--sglang-stages", default=".cache/dsa-stages", metavar="DIR",
                    help="where sglang-kernel's Hopper common_ops.abi3.so lies (default %(default)s; else an "
                         "installed sgl_kernel); natively on Hopper only")
    ap.add_argument("--no-sglang", action="store_true", help="do not time SGLang's stages")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_dsa needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    except ValueError:
        print(f"--cases {args.cases!r}: give BSxCONTEXT,... e.g. 1x8192,4x185000", file=sys.stderr)
        return 2
    device = "cuda"
    emulation = enable_emulation(args.emulate, device) if args.emulate else {}
    target = Target.emulating(args.emulate, device) if args.emulate else Target.detect(device)
    copy, matmul = ceilings(device)
    mma = emulation.get("mma_tflops", matmul)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"), copy_gbs=copy, matmul_tflops=matmul, **emulation)
    mode = f"{args.emulate}-emulated" if args.emulate else "native"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{meta['device']}: copy {copy:.0f} GB/s, matmul {matmul:.0f} TFLOP/s"
          + (f", mma.sync {mma:.0f} TFLOP/s" if args.emulate else ""), flush=True)
    checked = (None if args.reference_cases is None
               else {tuple(int(x) for x in c.split("x")) for c in args.reference_cases.split(",") if c})
    sglang = None
    if not args.emulate and not args.no_sglang:
        sglang = SGLangStages(args.sglang_stages, device)
        print("SGLang's stages: " + ("timed beside ours" if sglang.ok else f"skipped: {sglang.reason}"), flush=True)
        meta["sglang_stages"] = "timed" if sglang.ok else f"skipped: {sglang.reason}"
    rows = []
    for i, (bs, L) in enumerate(cases, 1):
        with_ref = not args.no_reference and (checked is None or (bs, L) in checked)
        row = measure(bs, L, device, target, copy, mma, bool(args.emulate), with_ref, sglang)
        rows.append(row)
        torch.cuda.empty_cache()
        print(f"[{i}/{len(cases)}] bs{bs} L{L}: dense {row['dense_us']:.1f} µs, DSA {row['dsa_us']:.1f} µs "
              f"(indexer {row['indexer_us']:.1f}, top-k {row['topk_us']:.1f}, attention {row['attention_us']:.1f}; "
              f"floor {row['dsa_floor_us']:.1f}), x{row['speedup_vs_dense']:.2f}, err {row['rel_err']:.1e}"
              + (f" | RTX PRO 6000 projected {row['rtx_projected_us']:.1f} µs "
                 f"(dense {row['dense_rtx_projected_us']:.1f})" if args.emulate else "")
              + (f" | SGLang indexer {row['sglang_indexer_us']:.1f}, top-k {row['sglang_topk_us']:.1f}"
                 + f" (logits {row['sglang_logits_rel']:.1e} from ours)" if sglang is not None and sglang.ok else ""),
              flush=True)
        (out / "dsa.json").write_text(json.dumps({"mode": mode, "meta": meta, "rows": [_nulls(r) for r in rows]},
                                                 indent=1, allow_nan=False))
    (out / "dsa.md").write_text(markdown(rows, meta))
    plot(rows, out / "dsa.png", f"GLM-5 DSA tree verify vs dense, {meta['device']}"
         f"{' (sm_120 emulation)' if args.emulate else ''}, {meta['date']}")
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
