"""Print a GPU's kernel-selection table, or what a verify call of a given shape launches there, without that GPU.

    python -m ddtree_kernels.describe --table --gpu sm120
    python -m ddtree_kernels.describe --heads 8 --draft 9 --kv fp8 --gpu sm120
    python -m ddtree_kernels.describe --heads 16 --draft 33 --bs 4 --gpu sm90 --no-gluon
"""

from __future__ import annotations

import argparse
import sys

from .launcher import plan_verify
from .plan_types import Rule, RuleTable
from .registry import KERNELS
from .selection import table_for
from .target import NAMED, Target


def rule_lines(rule: Rule, number: int) -> list[str]:
    """A rule as table lines: its match, its tile and what that kernel needs, its row tails."""
    needs = KERNELS[rule.tile.kernel].needs
    extra = f" (keys <= {rule.key_width_max})" if rule.key_width_max else ""
    out = [f"{number:>3}. {rule.cache:7} {rule.values:8} {rule.row_text():6} {rule.tile}{extra}"
           f"{f'  [needs {needs}]' if needs else ''}"]
    if rule.fused_tail_max_rows:
        out.append(f"{'':29}rows past whole blocks: up to {rule.fused_tail_max_rows} a block, in them")
    if rule.tail is not None:
        out.append(f"{'':29}then up to {rule.tail_max_rows} tail rows: {rule.tail}")
    return out


def table_text(table: RuleTable) -> str:
    """A rule table as text, in order: what `describe --table` prints."""
    lines = [f"{table.name}: the first rule that matches the call and whose kernel runs on the target",
             f"{'#':>4} {'cache':7} {'values':8} {'rows':6} prefix tile"]
    for number, rule in enumerate(table.rules, 1):
        lines += rule_lines(rule, number)
    return "\n".join(lines)


def describe(heads: int, draft: int, *, bs: int = 1, kv: str = "bf16", gpu: str = "sm120", sms: int | None = None,
             gluon: bool = True) -> str:
    """The plan's description (VerifyPlan.describe) for this shape on `gpu` (its SM count, or `sms`), and the
    rule it took. `gluon=False`: as with a Triton outside the Gluon tiles' tested range."""
    plan = plan_verify(bs, heads, draft, bs * draft, Target.named(gpu, sms=sms, gluon=gluon), kv_fp8=kv == "fp8")
    rule = rule_lines(plan.rule, plan.table.rules.index(plan.rule) + 1)
    return "\n".join([plan.describe(), f"  rule {rule[0].strip()}", *(f"  {line.strip()}" for line in rule[1:])])


def describe_table(gpu: str = "sm120") -> str:
    """The rule table `gpu` plans with (table_text)."""
    return table_text(table_for(Target.named(gpu)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree_kernels.describe", description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="store_true", help="print the GPU's rule table")
    ap.add_argument("--heads", type=int, help="query heads a GPU (GLM-5 at TP 8: 8)")
    ap.add_argument("--draft", type=int, help="draft tokens a request (DDTree budget + 1)")
    ap.add_argument("--bs", type=int, default=1, help="requests in the batch")
    ap.add_argument("--kv", choices=["bf16", "fp8"], default="bf16", help="KV cache dtype")
    ap.add_argument("--gpu", choices=sorted(NAMED), default="sm120", help="sm120: RTX PRO 6000; sm90: H100/H200")
    ap.add_argument("--sms", type=int, help="SM count, if not the GPU's usual one")
    ap.add_argument("--no-gluon", action="store_true",
                    help="plan as with a Triton outside the Gluon tiles' tested range (gluon_shared.TESTED_TRITON)")
    args = ap.parse_args(argv)
    if args.table:
        print(describe_table(args.gpu))
        if args.heads is None:
            return 0
    if args.heads is None or args.draft is None:
        ap.error("give --heads and --draft (a call to describe), or --table")
    print(describe(args.heads, args.draft, bs=args.bs, kv=args.kv, gpu=args.gpu, sms=args.sms,
                   gluon=not args.no_gluon))
    return 0


if __name__ == "__main__":
    sys.exit(main())
