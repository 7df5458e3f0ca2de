"""Session 6, no GPU: Triton's interpreter (TRITON_INTERPRET=1) rounds fp32 -> float8e4nv differently from
torch (round to nearest even) and from the GPU's cvt.rn.satfinite. Run: TRITON_INTERPRET=1 python kernels/results/probes/interp_e4m3.py"""
import torch
import triton
import triton.language as tl


@triton.jit
def to_e4m3_and_back(X, Y):
    c = tl.arange(0, 16)
    tl.store(Y + c, tl.load(X + c).to(tl.float8e4nv).to(tl.float32))


x = torch.tensor([1.0, 1.06, 1.07, 1.1, 1.12, 1.13, 1.2, 17.0, 17.1, 30.0, 31.0, 31.7, 0.001, 0.003, 0.3, 300.0])
y = torch.empty_like(x)
to_e4m3_and_back[(1,)](x, y)
ref = x.to(torch.float8_e4m3fn).float()
print(f"Triton {triton.__version__} interpreter vs torch: {int((y != ref).sum())} of {x.numel()} differ")
for a, b, c in zip(x.tolist(), y.tolist(), ref.tolist()):
    if b != c:
        print(f"  {a:g}: interpreter {b:g}, torch {c:g}")
