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
attention backend, while DDTree verify needs `--page-size 1` and `--attention-backend triton`; such
a DDTree launch is refused with the way out (inventory/README.md, "GLM-5").

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
    if algorithm and algorithm.upper() == "DDTREE":
        problem = dsa_problem(getattr(args, "model_path", ""), version)
        if problem:
            return LaunchCheck(False, version, problem, algorithm)
    return LaunchCheck(True, version, algorithm=algorithm or "")


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


def dsa_problem(model_path: str, version: str, sglang_dir: Path | None = None) -> str:
    """Why a DDTree server cannot run this model as configured, if SGLang says it is a DSA model ("" if not)."""
    config_file = Path(model_path or "") / "config.json"
    if not config_file.is_file():
        return ""  # a hub id or a path only the server sees: nothing to read here
    # As SGLang loads it (transformers' config class, defaults included): a GLM-5 config.json without
    # index_topk still gets GlmMoeDsaConfig's default 2048.
    config = loaded_config(config_file.parent)
    if not is_deepseek_dsa(sglang_dir)(config):
        return ""
    arch = (getattr(config, "architectures", None) or ["?"])[0]
    topk = getattr(config, "index_topk", None)
    return (f"{arch} at {config_file.parent} has index_topk={topk}, so SGLang {version} runs it "
            "as a DSA model: a DSATokenToKVPool that needs page size 64 on CUDA and the dsa attention backend, while "
            "DDTree verify needs --page-size 1 and --attention-backend triton. Serve it as dense MLA instead: point "
            "the model path at its dense-MLA view (ddtree_model_dense_mla: ddtree-ops model-view; inventory/README.md, "
            "'GLM-5')")
