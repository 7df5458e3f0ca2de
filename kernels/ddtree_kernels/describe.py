"""Print the kernels a verify call of a given shape launches on a given GPU, without that GPU.

    python -m ddtree_kernels.describe --heads 8 --draft 9 --kv fp8 --gpu sm120
    python -m ddtree_kernels.describe --heads 16 --draft 33 --bs 4 --gpu sm90
"""

from __future__ import annotations

import argparse
import sys

from .launcher import plan_verify

# (compute capability, SMs) of the GPUs this repository plans for.
GPUS = {"sm120": ((12, 0), 188), "sm90": ((9, 0), 132)}


def describe(heads: int, draft: int, *, bs: int = 1, kv: str = "bf16", gpu: str = "sm120",
             sms: int | None = None) -> str:
    """The plan's description (VerifyPlan.describe) for this shape on `gpu` (its SM count, or `sms`)."""
    capability, default_sms = GPUS[gpu]
    plan = plan_verify(bs, heads, draft, bs * draft, "cpu", kv_fp8=kv == "fp8", gpu=(capability, sms or default_sms))
    return plan.describe()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree_kernels.describe", description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, required=True, help="query heads a GPU (GLM-5 at TP 8: 8)")
    ap.add_argument("--draft", type=int, required=True, help="draft tokens a request (DDTree budget + 1)")
    ap.add_argument("--bs", type=int, default=1, help="requests in the batch")
    ap.add_argument("--kv", choices=["bf16", "fp8"], default="bf16", help="KV cache dtype")
    ap.add_argument("--gpu", choices=sorted(GPUS), default="sm120", help="sm120: RTX PRO 6000; sm90: H100/H200")
    ap.add_argument("--sms", type=int, help="SM count, if not the GPU's usual one")
    args = ap.parse_args(argv)
    print(describe(args.heads, args.draft, bs=args.bs, kv=args.kv, gpu=args.gpu, sms=args.sms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
