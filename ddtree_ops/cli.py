"""`ddtree-ops`: the one command line for this repository's Python tooling.

    ddtree-ops patch check|apply|revert|status TARGET [--series NAME] [--patches DIR] [--json]
    ddtree-ops release-job [--versions 0.5.14,0.5.23] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

from . import patchtool
from .series import patches_dir


def _patch(args: argparse.Namespace) -> int:
    action = getattr(patchtool, args.action)
    try:
        report = action(args.target, series=args.series, patches=args.patches, sglang_version=args.sglang_version)
    except patchtool.PatchError as exc:
        print(f"ddtree-ops patch {args.action}: FAILED: {exc}", file=sys.stderr)
        return 1
    except (LookupError, ValueError, FileNotFoundError) as exc:
        print(f"ddtree-ops patch {args.action}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json())
    else:
        print(f"{report.action}: {report.outcome} — series {report.series} on SGLang {report.sglang_version} "
              f"({report.layout}, {report.target})")
        for name, state in report.patches.items():
            print(f"  {state:15} {name}")
    return 0


def _release_job(args: argparse.Namespace) -> int:
    from .release_job import run_release_job

    versions = args.versions.split(",") if args.versions else None
    matrix = run_release_job(versions=versions, out=args.out, patches=args.patches, oldest=args.oldest)
    return 0 if matrix.supported_all() or not args.strict else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddtree-ops", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("patch", help="check, apply, revert or report the SGLang patch series")
    p.add_argument("action", choices=["check", "apply", "revert", "status"])
    p.add_argument("target", help="site-packages dir, unpacked wheel, or sglang git checkout")
    p.add_argument("--series", help="use this series instead of the one matching the SGLang version")
    p.add_argument("--patches", default=None, help=f"patch folder with series.toml (default {patches_dir()})")
    p.add_argument("--sglang-version", help="the target's SGLang version when it cannot be read from the tree")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_patch)

    r = sub.add_parser("release-job", help="apply the patches to each SGLang release on PyPI and report")
    r.add_argument("--versions", help="comma-separated releases (default: every release on PyPI from --oldest)")
    r.add_argument("--oldest", default="0.5.14", help="oldest release to include (default 0.5.14)")
    r.add_argument("--out", default="release-report", help="folder for matrix.json and matrix.md")
    r.add_argument("--patches", default=None)
    r.add_argument("--strict", action="store_true", help="exit 1 unless every release is supported")
    r.set_defaults(func=_release_job)

    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
