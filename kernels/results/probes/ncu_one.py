import sys, dataclasses, torch
sys.path.insert(0, "kernels"); sys.path.insert(0, "kernels/results/probes")
from probe4 import make, PORTABLE, TileConfig, plan_verify, Workspace, run_verify, MASK_COMPACT
bs, L_, H, n = map(int, sys.argv[1:5]); t = tuple(map(int, sys.argv[5:9]))
cfg = dataclasses.replace(PORTABLE, prefix=TileConfig(*t), max_splits=512, min_chunk=512)
q, kd, qo, kv, vis, setups = make(bs, L_, H, n, False, 1)
plan = plan_verify(bs, H, n, q.shape[0], "cuda", config=cfg); ws = Workspace.for_plan(plan, "cuda")
out = torch.empty(q.shape[0], H, 512, dtype=torch.bfloat16, device="cuda"); kc, kvi = setups[0]
for _ in range(3):
    run_verify(plan, ws, q, kc, kc[..., :512], kv, kvi, kd, kd[..., :512], qo, out, mask_mode=MASK_COMPACT, mask=vis, mask_indptr=None, mask_row_stride=n, sm_scale=1/16)
torch.cuda.synchronize()
