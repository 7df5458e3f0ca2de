"""`ddtree-ops`: the one command line for this repository's Python tooling.

    ddtree-ops patch check|apply|revert|status TARGET [--series NAME] [--patches DIR] [--json]
    ddtree-ops release-job [--versions 0.5.14,0.5.23] [--out DIR]
    ddtree-ops smoke --endpoint URL [--model M] [--min-accept-length X] [--wait S] [--verify-stats DIR [--expect-dsa]]
                     [--json FILE]
    ddtree-ops bundle --sglang-version 0.5.23 [--pip-source wheelhouse|index] [--out DIR] [--json]
    ddtree-ops launch-check [--preload MODULE] [--json] (--launch LAUNCH.json [--with-api-key] | -- SERVER ARGS...)
    ddtree-ops serve LAUNCH.json
    ddtree-ops model-view CHECKPOINT VIEW [--json]
    ddtree-ops venv-record write|check [--record FILE] [--patches DIR]
    ddtree-ops bench --endpoint URL [--contexts 8192,...] [--concurrency 1,4] [--out DIR] [--previous FILE]
                     [--deadline S] [--release ID]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from . import patchtool
from .series import patches_dir

BENCH_DEADLINE_S = 1800.0  # throughput.DEFAULT_DEADLINE_S (not imported: it would load requests for every command)


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
            print(f"  {state:22} {name}")
    if args.action == "status" and report.outcome not in patchtool.CLEAN_STATES:
        print(f"ddtree-ops patch status: {report.outcome}: `ddtree-ops patch check {args.target}` says what to do",
              file=sys.stderr)
        return 1
    return 0


def _release_job(args: argparse.Namespace) -> int:
    from .release_job import run_release_job

    versions = args.versions.split(",") if args.versions else None
    from .ddtree_sources import load_sources

    sources = [] if args.no_ddtree_sources else load_sources(args.ddtree_sources)
    matrix = run_release_job(versions=versions, out=args.out, patches=args.patches, oldest=args.oldest,
                             ddtree_sources=sources, fetch_git=args.fetch_git)
    return 0 if matrix.supported_all() or not args.strict else 1


def _smoke(args: argparse.Namespace) -> int:
    from .endpoint import Endpoint
    from .smoke import print_report, run_smoke

    report = run_smoke(Endpoint(args.endpoint, args.api_key, args.timeout), model=args.model,
                       min_accept_length=args.min_accept_length, wait_s=args.wait, verify_stats=args.verify_stats,
                       expect_dsa=args.expect_dsa)
    print_report(report)
    if args.json:
        Path(args.json).write_text(report.to_json())
    return 0 if report.ok else 1


def _bench(args: argparse.Namespace) -> int:
    from .endpoint import Endpoint, EndpointError
    from .throughput import run_throughput

    try:
        run = run_throughput(Endpoint(args.endpoint, args.api_key, args.timeout), contexts=args.contexts,
                             concurrency=args.concurrency, output_len=args.output_len, rounds=args.rounds,
                             vocab=args.vocab, out=args.out, previous=args.previous, deadline_s=args.deadline,
                             release=args.release)
    except EndpointError as exc:
        print(f"ddtree-ops bench: {exc}", file=sys.stderr)
        return 1
    measured = any(p.ok for p in run.points)
    if measured:
        print(Path(run.files[1]).read_text())
    for p in run.points:
        if p.ok < p.requests:
            print(f"context {p.context} concurrency {p.concurrency}: {p.requests - p.ok} of {p.requests} request(s) "
                  f"failed: {p.errors[0] if p.errors else ''}", file=sys.stderr)
    if run.stopped:
        print(f"ddtree-ops bench: stopped early: {run.stopped}", file=sys.stderr)
    if not measured:
        sent = sum(p.requests for p in run.points)
        why = f"all {sent} request(s) sent failed" if sent else "no /generate request sent"
        print(f"ddtree-ops bench: nothing measured ({why}), no table or plot written", file=sys.stderr)
    print(f"ddtree-ops bench: wrote {', '.join(str(Path(f).resolve()) for f in run.files)}"
          + (" (the record of a run that stopped early)" if run.stopped else ""),
          file=sys.stdout if measured else sys.stderr)
    return 1 if run.stopped or any(p.ok < p.requests for p in run.points) else 0


def _bundle(args: argparse.Namespace) -> int:
    from .bundle import BundleError, BundleSpec, build_bundle

    spec = BundleSpec(sglang_version=args.sglang_version or "", sglang_git_url=args.sglang_git_url or "",
                      sglang_git_commit=args.sglang_git_commit or "", pip_source=args.pip_source,
                      with_dependencies=not args.no_dependencies, python_version=args.python_version or "",
                      platforms=args.platform or [], extra_constraints=args.constraint or [],
                      extra_wheels=args.extra_wheel or [], extra_packages=args.extra_package or [],
                      patches=args.patches or "", patch_series=args.patch_series or "")
    try:
        bundle = build_bundle(spec, args.out, log=lambda msg: print(msg, file=sys.stderr))
    except BundleError as exc:
        print(f"ddtree-ops bundle: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(bundle)))
    else:
        print(f"bundle {bundle.id}: {bundle.tar}")
    return 0


def _launch_check(args: argparse.Namespace) -> int:
    from .launch_check import LaunchCheck, check_launch_args
    from .serve import LaunchError, read_launch

    server_args = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
    if args.launch:
        if server_args:
            print("ddtree-ops launch-check: give the arguments either in --launch FILE or after --, not both",
                  file=sys.stderr)
            return 2
        try:
            _, server_args = read_launch(args.launch)
        except LaunchError as exc:
            print(f"ddtree-ops launch-check: {exc}", file=sys.stderr)
            return 2
        if args.with_api_key:  # the key itself stays in the env file: only its flag matters to the parser
            server_args += ["--api-key", "checked-not-shown"]
    try:
        result = check_launch_args(server_args, preload=args.preload)
    except Exception as exc:  # a release whose argument parser does not even import would not start either
        problem = f"importing SGLang's argument parser failed: {type(exc).__name__}: {exc}"
        result = LaunchCheck(False, "unknown", problem)
    if args.json:
        print(result.to_json())
    elif result.ok:
        print(f"SGLang {result.sglang_version} accepts the server arguments")
    if not result.ok:
        print(f"ddtree-ops launch-check: {result.problem}", file=sys.stderr)
    return 0 if result.ok else 1


def _serve(args: argparse.Namespace) -> int:
    from .serve import LaunchError, serve

    try:
        serve(args.launch)  # replaces this process with the server
    except LaunchError as exc:
        print(f"ddtree-ops serve: {exc}", file=sys.stderr)
    return 2


def _model_view(args: argparse.Namespace) -> int:
    from .model_view import ModelViewError, make_view

    try:
        view = make_view(args.source, args.dest)
    except ModelViewError as exc:
        print(f"ddtree-ops model-view: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(view.to_json())
    else:
        what = "dense-MLA view of a DSA checkpoint" if view.dsa else "view (not a DSA checkpoint: config unchanged)"
        print(f"{view.dest}: {what}, {view.linked} files linked; loaded back: {view.checked}")
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (give e.g. 8192, not 8k)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _positive_ints(text: str) -> list[int]:
    values = [_positive_int(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more whole numbers, comma-separated")
    return values


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0")
    return value


def _existing_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no file {text!r} (an earlier run's throughput.json)")
    return text


def _url(text: str) -> str:
    from urllib.parse import urlparse

    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL (give e.g. http://127.0.0.1:30000)")
    return text


def _endpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", type=_url, default=os.environ.get("DDTREE_ENDPOINT", "http://127.0.0.1:30000"),
                   help="base URL of the SGLang server (default $DDTREE_ENDPOINT or http://127.0.0.1:30000)")
    p.add_argument("--api-key", default=os.environ.get("SGLANG_API_KEY"), help="default $SGLANG_API_KEY")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (long contexts are slow)")


def _venv_record(args: argparse.Namespace) -> int:
    from . import venv_record

    path = Path(args.record) if args.record else venv_record.default_record_path()
    if args.action == "write":
        patch_record, files = _applied_patches(args.patches)
        record = venv_record.write(path, patch_record, files)
        print(f"recorded {len(record['distributions'])} distributions and {len(record['files'])} files in {path}")
        return 0
    found = venv_record.check(path)
    for line in found:
        print(f"MODIFIED: {line}")
    if found:
        print(f"this venv ({Path(sys.prefix).resolve()}) is not what its deploy built (record: {path}); "
              "redeploy with -e ddtree_venv_rebuild=true to rebuild it", file=sys.stderr)
        return 1
    print(f"venv matches its record ({path})")
    return 0


def _applied_patches(patches: str | None) -> tuple[dict | None, list[str]]:
    """The patch tool's record in this venv's SGLang and the files its series touches (site-packages-relative)."""
    import sysconfig

    from .series import load_series
    from .sglang_tree import locate

    try:
        tree = locate(sysconfig.get_paths()["purelib"])
    except (LookupError, FileNotFoundError, ValueError):
        return None, []
    record = patchtool.read_record(tree)
    if not record or not patches:
        return record, []
    series = next((s for s in load_series(patches) if s.name == record.get("series")), None)
    files = [f for p in (series.patches if series else ()) for f in patchtool.patch_files(p)]
    return record, files


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
    r.add_argument("--ddtree-sources", default=None,
                   help="DDTree git sources to check too (default patches/ddtree-sources.toml)")
    r.add_argument("--no-ddtree-sources", action="store_true", help="releases only")
    r.add_argument("--fetch-git", action="store_true",
                   help="fetch DDTree sources without a local snapshot from their git URL (needs the git host)")
    r.add_argument("--strict", action="store_true", help="exit 1 unless every release is supported")
    r.set_defaults(func=_release_job)

    s = sub.add_parser("smoke", help="smoke-test a live endpoint (exit 1 on any failed check)")
    _endpoint_args(s)
    s.add_argument("--model", help="served model name (default: the first one listed)")
    s.add_argument("--min-accept-length", type=float, help="fail below this speculative acceptance length")
    s.add_argument("--wait", type=float, default=0.0, help="poll /health_generate this long before failing")
    s.add_argument("--verify-stats", help="folder of ddtree_kernels' verify counts (the server's "
                   "DDTREE_VERIFY_STATS_DIR): fail unless TARGET_VERIFY reached the kernel")
    s.add_argument("--expect-dsa", action="store_true", help="with --verify-stats: the model is a DSA checkpoint "
                   "served sparse; fail unless the DSA tree verify served it, none declined")
    s.add_argument("--json", help="also write the report as JSON to this file")
    s.set_defaults(func=_smoke)

    u = sub.add_parser("bundle", help="build the release bundle a host installs (wheels, patches, pins)")
    u.add_argument("--sglang-version", help="exact PyPI release")
    u.add_argument("--sglang-git-url", help="instead of a release: git URL of the SGLang branch")
    u.add_argument("--sglang-git-commit", help="with --sglang-git-url: the full 40-hex commit")
    u.add_argument("--pip-source", choices=["wheelhouse", "index"], default="wheelhouse")
    u.add_argument("--no-dependencies", action="store_true", help="hosts without the GPU stack (test hosts)")
    u.add_argument("--python-version", help="the host's Python, e.g. 3.12 (default: this one)")
    u.add_argument("--platform", action="append", help="the host's wheel platform tags (repeat)")
    u.add_argument("--constraint", action="append", help="extra exact pin, e.g. torch==2.9.1 (repeat)")
    u.add_argument("--extra-wheel", action="append", help="a local wheel to ship and install as well (repeat)")
    u.add_argument("--extra-package", action="append", help="a requirement to install from the bundle (repeat)")
    u.add_argument("--patches", help="patch folder with series.toml (default: the repository's patches/)")
    u.add_argument("--patch-series", help="the series the host applies (default: picked from the SGLang tree)")
    u.add_argument("--out", default=".cache/bundles", help="bundle cache folder (default .cache/bundles)")
    u.add_argument("--json", action="store_true", help="print the bundle description as JSON")
    u.set_defaults(func=_bundle)

    c = sub.add_parser("launch-check", help="have the installed SGLang parse server arguments (exit 1 if refused)")
    c.add_argument("--preload", help="import this module first (the test hosts' GPU-stack stand-ins)")
    c.add_argument("--json", action="store_true", help="print the verdict as JSON")
    c.add_argument("--launch", help="a release's launch.json: check exactly the argument vector the unit runs")
    c.add_argument("--with-api-key", action="store_true", help="with --launch: the unit adds --api-key too")
    c.add_argument("server_args", nargs=argparse.REMAINDER, help="-- then the arguments of sglang.launch_server")
    c.set_defaults(func=_launch_check)

    e = sub.add_parser("serve", help="exec a release's server from its launch.json (the systemd unit runs this)")
    e.add_argument("launch", help="the release's launch.json (module and argument vector)")
    e.set_defaults(func=_serve)

    v = sub.add_parser("model-view", help="write the dense-MLA view of a DSA checkpoint (GLM-5) for a DDTree server")
    v.add_argument("source", help="the checkpoint folder (config.json and weights)")
    v.add_argument("dest", help="the view's folder (config.json written, every other file linked)")
    v.add_argument("--json", action="store_true", help="print what was done as JSON")
    v.set_defaults(func=_model_view)

    w = sub.add_parser("venv-record", help="record what this venv holds, or check it still does (exit 1 naming "
                       "each difference)")
    w.add_argument("action", choices=["write", "check"])
    w.add_argument("--record", help="the record file (default: venv-record.json beside this venv)")
    w.add_argument("--patches", help="with write: the patch folder applied (its files are recorded too)")
    w.set_defaults(func=_venv_record)

    b = sub.add_parser("bench", help="decode throughput against context length and concurrency",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _endpoint_args(b)
    b.add_argument("--contexts", type=_positive_ints, default="8192,32768,65536,131072,185000",
                   help="prompt lengths in tokens, comma-separated")
    b.add_argument("--concurrency", type=_positive_ints, default="1,4", help="requests in flight, comma-separated")
    b.add_argument("--output-len", type=_positive_int, default=256, help="tokens generated a request")
    b.add_argument("--rounds", type=_positive_int, default=3,
                   help="rounds a point, one after another, each `concurrency` requests at once; the point reports "
                        "their median and range")
    b.add_argument("--vocab", type=_positive_int, default=32000, help="prompt token ids are drawn from [100, vocab)")
    b.add_argument("--out", default="throughput", help="folder for throughput.json/.md/.png")
    b.add_argument("--previous", type=_existing_file, help="an earlier throughput.json to compare against")
    b.add_argument("--deadline", type=_positive_float, default=BENCH_DEADLINE_S,
                   help="seconds for the whole run: past it no request is sent, those in flight are cut off, and "
                        "what was measured is written (--timeout still bounds each request)")
    b.add_argument("--release", help="the deploy's release id, as `fab status` names it, for the JSON and the plot; "
                                     "without it, the SGLang build /server_info reports")
    b.set_defaults(func=_bench)

    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
