import dataclasses, json, os, sys, torch, triton
sys.path.insert(0, "kernels")
from ddtree_kernels.configs import PORTABLE, TileConfig
import ddtree_kernels.launcher as L
from ddtree_kernels.launcher import plan_verify, run_verify, Workspace
from ddtree_kernels.tree import MASK_COMPACT
from ddtree_kernels import masks
dev = "cuda"; OUT = os.environ.get("OUT", ".")
copy, mm = 4260.0, 683.0
def make(bs, L_, H, n, fp8, pools):
    T = bs * n; S = bs * L_ + 1000
    qo = (torch.arange(bs + 1, dtype=torch.int32) * n).to(dev); kv = (torch.arange(bs + 1, dtype=torch.int32) * L_).to(dev)
    setups = [(torch.randn(S, 1, 576, device=dev).to(torch.float8_e4m3fn if fp8 else torch.bfloat16), torch.randperm(S, device=dev)[: bs * L_]) for _ in range(pools)]
    q = torch.randn(T, H, 576, device=dev, dtype=torch.bfloat16); kd = torch.randn(T, 1, 576, device=dev, dtype=torch.bfloat16)
    vis = masks.parents_to_visibility(masks.random_parents([n] * bs), qo.cpu(), n).to(dev).view(torch.uint8)
    return q, kd, qo, kv, vis, setups
class Nop:
    def __getitem__(s, g): return lambda *a, **k: None
def graph_time(cfg, shape, fp8=False, parts="all", pools=3):
    bs, L_, H, n = shape
    q, kd, qo, kv, vis, setups = make(bs, L_, H, n, fp8, pools)
    plan = plan_verify(bs, H, n, q.shape[0], dev, config=cfg)
    ws = Workspace.for_plan(plan, dev); out = torch.empty(q.shape[0], H, 512, dtype=torch.bfloat16, device=dev)
    saved = (L.tree_block_kernel, L.merge_parts_kernel)
    if parts == "prefix": L.tree_block_kernel = L.merge_parts_kernel = Nop()
    graphs = []
    try:
        for kc, kvi in setups:
            f = lambda kc=kc, kvi=kvi: run_verify(plan, ws, q, kc, kc[..., :512], kv, kvi, kd, kd[..., :512], qo, out, mask_mode=MASK_COMPACT, mask=vis, mask_indptr=None, mask_row_stride=n, sm_scale=1/16)
            f(); torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g): f()
            graphs.append(g)
    finally:
        L.tree_block_kernel, L.merge_parts_kernel = saved
    i = [0]
    def rep():
        graphs[i[0] % len(graphs)].replay(); i[0] += 1
    t = triton.testing.do_bench(rep, warmup=25, rep=200, return_mode="median") * 1e3
    byts = bs * L_ * 576 * (1 if fp8 else 2); flops = 2 * bs * n * H * L_ * 1088
    floor = max(byts / copy / 1e3, flops / mm / 1e6)
    del setups; torch.cuda.empty_cache()
    return dict(us=round(t, 1), gbs=round(byts / t / 1e3), tflops=round(flops / t / 1e6), eff=round(floor / t, 3), splits=plan.num_splits)
if __name__ == "__main__":
    tiles = dict(B=(16,32,4,3), E=(32,32,4,3), a=(16,32,4,5), d=(32,32,4,5), f=(64,32,8,5), h=(64,32,8,3))
    shapes = dict(S1=(1,185000,8,9), S2=(1,185000,8,1), S6=(1,8192,8,9), S3=(1,185000,16,9))
    for sname, shp in shapes.items():
        for tname, t in tiles.items():
            cfg = dataclasses.replace(PORTABLE, prefix=TileConfig(*t), prefix_fp8=TileConfig(*t), max_splits=512, min_chunk=512)
            for parts in ("all", "prefix"):
                r = graph_time(cfg, shp, parts=parts); r.update(shape=sname, tile=tname, parts=parts); print(r, flush=True)
        if sname == "S2":
            for tname in ("B", "a"):
                cfg = dataclasses.replace(PORTABLE, prefix_fp8=TileConfig(*tiles[tname]), max_splits=512, min_chunk=512)
                r = graph_time(cfg, shp, fp8=True); r.update(shape=sname, tile=tname, fp8=True); print(r, flush=True)
