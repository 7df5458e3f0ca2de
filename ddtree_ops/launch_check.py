"""Have the installed SGLang parse a server's argument list before the deploy switches to it.

Run with the new release's own Python, so the parser is that release's: `ServerArgs.add_cli_args`
builds it and parses the exact list the unit will run, and a `--speculative-algorithm` is
resolved by SGLang's own `SpeculativeAlgorithm.from_string`. A release that lacks a flag or an
algorithm (e.g. DDTREE on a PyPI release) is refused with SGLang's words, before anything is
switched. No list of flags is kept here.

    ddtree-ops launch-check [--preload MODULE] [--json] -- --model-path /models/GLM-5 ...

When the model's config.json is on this host (`--model-path` a folder), the check also asks
SGLang's own `is_deepseek_dsa` whether the model is a DSA model (GLM-5, DeepSeek-V3.2 with
`index_topk`): SGLang gives those the DSA KV pool, which asserts page size 64 on CUDA, and the DSA
attention backend, while DDTree verify needs `--page-size 1` and `--attention-backend triton`. With the
ddtree-v2 series' patch 0007 SGLang keeps page size 1 for them and our backend serves their sparse tree
verify: such a launch passes (`attention: "dsa"` in the result) when the installed SGLang carries 0007 and
the launch has a bf16 cache; otherwise it is refused with what is missing and the way out (the dense-MLA
view, inventory/README.md, "GLM-5").

`--preload` imports a module first: the test hosts, which have no GPU stack, preload stand-ins
for torch and friends (tests/endpoint/standin_gpu_stack.py); production imports everything real.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .model_view import loaded_config


@dataclass
class LaunchCheck:
    ok: bool
    sglang_version: str
    problem: str = ""  # SGLang's own message, naming the flag or value it refuses
    algorithm: str = ""
    attention: str = ""  # "dsa": a DSA checkpoint served sparse (ddtree_kernels' DSA tree verify, patch 0007)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class _ParseError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str):
        raise _ParseError(message)


def check_launch_args(argv: list[str], preload: str | None = None) -> LaunchCheck:
    """Parse `argv` with the installed SGLang's server parser; `ok` False names what it refused."""
    if preload:
        importlib.import_module(preload)
    import sglang

    version = getattr(sglang, "__version__", "unknown")
    # Importing server_args logs and warns on a host without a GPU; only the verdict matters here.
    with contextlib.redirect_stderr(io.StringIO()):
        from sglang.srt.server_args import ServerArgs

        parser = _RaisingParser(prog="sglang serve", add_help=False)
        ServerArgs.add_cli_args(parser)
    try:
        args = parser.parse_args(argv)
    except _ParseError as exc:
        return LaunchCheck(False, version, f"SGLang {version} refuses the arguments: {exc}")
    algorithm = getattr(args, "speculative_algorithm", None)
    if algorithm:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        try:
            SpeculativeAlgorithm.from_string(algorithm)
        except ValueError as exc:
            return LaunchCheck(False, version, f"SGLang {version} refuses --speculative-algorithm {algorithm}: {exc}",
                               algorithm)
    attention = ""
    if algorithm and algorithm.upper() == "DDTREE":
        model_path = getattr(args, "model_path", "")
        config = _dsa_config(model_path)
        if config is not None:
            problem = _sparse_dsa_problem(config, model_path, version, None, args)
            if problem:
                return LaunchCheck(False, version, problem, algorithm)
            attention = "dsa"
    return LaunchCheck(True, version, algorithm=algorithm or "", attention=attention)


def is_deepseek_dsa(sglang_dir: Path | None = None):
    """SGLang's `is_deepseek_dsa` (the installed one, or that of the `sglang/` package at `sglang_dir`), run
    from its source: importing model_config itself pulls in the whole quantisation stack, which a host
    without the GPU stack cannot import."""
    from .patched_checks import extract

    if sglang_dir is None:
        import sglang

        sglang_dir = Path(sglang.__file__).parent
    source = Path(sglang_dir) / "srt" / "configs" / "model_config.py"
    tree = ast.parse(source.read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    helpers = [name for name in ("_hf_arch", "_hf_attr") if name in defined]  # newer releases read dicts too
    return extract(source, ["is_deepseek_dsa", *helpers], {})["is_deepseek_dsa"]


def _dsa_config(model_path: str, sglang_dir: Path | None = None):
    """The model's config as SGLang loads it, if SGLang says it is a DSA model; None otherwise (or unreadable)."""
    config_file = Path(model_path or "") / "config.json"
    if not config_file.is_file():
        return None  # a hub id or a path only the server sees: nothing to read here
    # As SGLang loads it (transformers' config class, defaults included): a GLM-5 config.json without
    # index_topk still gets GlmMoeDsaConfig's default 2048.
    config = loaded_config(config_file.parent)
    return config if is_deepseek_dsa(sglang_dir)(config) else None


def sparse_dsa_gap(sglang_dir: Path | None = None) -> str:
    """What the installed SGLang lacks to serve a DSA model under DDTree (patch 0007's checks), "" if nothing."""
    from .patched_checks import dsa_checks
    from .sglang_tree import locate

    if sglang_dir is None:
        import sglang

        sglang_dir = Path(sglang.__file__).parent
    try:
        failed = [c.name for c in dsa_checks(locate(sglang_dir)) if not c.ok]
    except (OSError, ValueError) as exc:  # files missing or moved: not the patched branch
        return f"its DSA files are not the patched ddtree-v2 ones ({type(exc).__name__}: {exc})"
    return "; ".join(failed)


def dsa_problem(model_path: str, version: str, sglang_dir: Path | None = None, args=None) -> str:
    """Why a DDTree server cannot run this model as configured, if SGLang says it is a DSA model ("" if not).

    `args`: the parsed launch. A DSA model is served sparse at page size 1 (ddtree_kernels' DSA tree verify)
    where SGLang carries patch 0007 and the launch has --page-size 1, --attention-backend triton and a bf16
    cache; otherwise the refusal names what is missing and the dense-MLA view as the other way."""
    config = _dsa_config(model_path, sglang_dir)
    return "" if config is None else _sparse_dsa_problem(config, model_path, version, sglang_dir, args)


def _sparse_dsa_problem(config, model_path: str, version: str, sglang_dir: Path | None, args) -> str:
    """dsa_problem for a config already known to be DSA."""
    arch = (getattr(config, "architectures", None) or ["?"])[0]
    what = f"{arch} at {model_path} has index_topk={getattr(config, 'index_topk', None)}, a DSA model"
    dense = ("Or serve it as dense MLA: point the model path at its dense-MLA view (ddtree_dsa_attention: "
             "dense-view; inventory/README.md, 'GLM-5')")
    gap = sparse_dsa_gap(sglang_dir)
    if gap:
        return (f"{what}: SGLang {version} runs it with a DSATokenToKVPool that needs page size 64 on CUDA, while "
                f"DDTree verify needs --page-size 1; SGLang at page size 1 needs the ddtree-v2 series' patch 0007, "
                f"and this SGLang fails: {gap}. Install the patched DDTree build. {dense}")
    wrong = []
    if args is not None:
        if int(getattr(args, "page_size", 1) or 1) != 1:
            wrong.append(f"--page-size {args.page_size} (needs 1)")
        if getattr(args, "attention_backend", None) != "triton":
            wrong.append(f"--attention-backend {getattr(args, 'attention_backend', None)} (needs triton)")
        if getattr(args, "kv_cache_dtype", "auto") not in ("bfloat16", "bf16"):
            wrong.append(f"--kv-cache-dtype {getattr(args, 'kv_cache_dtype', 'auto')} (needs bfloat16: ddtree_kernels' "
                         "DSA verify reads 576 bf16 values a token; SGLang's fp8 DSA rows carry per-128 scales)")
    if wrong:
        return f"{what}, served sparse by ddtree_kernels under DDTree only with: {', '.join(wrong)}. {dense}"
    return ""
