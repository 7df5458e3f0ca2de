import dataclasses, sys, os
sys.path.insert(0, "kernels"); sys.path.insert(0, "kernels/results/probes")
from probe4 import graph_time, PORTABLE, TileConfig
tiles = dict(B=(16,32,4,3), B8=(16,32,8,3), k=(32,32,8,3), a=(16,32,4,5), B8s5=(16,32,8,5), P=(32,32,8,2), m16=(16,16,8,3))
shapes = dict(S2=(1,185000,8,1), S1=(1,185000,8,9), S3=(1,185000,16,9), S6=(1,8192,8,9), S5=(1,185000,8,33), S4=(4,65536,16,9))
for sname, shp in shapes.items():
    for tname, t in tiles.items():
        if sname in ("S5", "S4") and tname in ("a", "m16", "P"): continue
        for mbd in (64, 512):
            if mbd == 512 and tname not in ("B", "B8"): continue
            cps = 2
            cfg = dataclasses.replace(PORTABLE, prefix=TileConfig(*t), prefix_fp8=TileConfig(*t), max_splits=512, min_chunk=512, merge_block_d=mbd, merge_block_s=32 if mbd == 64 else 16, merge_num_warps=4 if mbd == 64 else 8, ctas_per_sm=cps)
            r = graph_time(cfg, shp); r.update(shape=sname, tile=tname, mbd=mbd); print(r, flush=True)
            if sname in ("S2", "S1") and mbd == 64 and tname in ("B", "B8", "k"):
                r = graph_time(cfg, shp, fp8=True); r.update(shape=sname, tile=tname, mbd=mbd, fp8=True); print(r, flush=True)
