"""Behaviour checks on a *patched* SGLang tree, shared by the tests and the release job.

SGLang's modules cannot be imported without a GPU build's dependencies, so each check
extracts the real patched function from the real source with `ast` and runs it (never a
copy). What it imports is supplied by name-matched stand-ins: the policy matches backends
by class name, and `contract_*` checks hold the stand-ins to what the same release's real
source defines, so they cannot drift.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .sglang_tree import SglangTree

DFLASH_UTILS = "srt/speculative/dflash_utils.py"
DDTREE_UTILS = "srt/speculative/ddtree_utils.py"
DDTREE_WORKER_V2 = "srt/speculative/ddtree_worker_v2.py"
MEMORY_POOL = "srt/mem_cache/memory_pool.py"
DSA_INDEXER = "srt/layers/attention/dsa/dsa_indexer.py"
OVERRIDES = "srt/arg_groups/overrides.py"
DEEPSEEK_DISPATCH = "srt/models/deepseek_common/attention_backend_handler.py"
REGISTRY = "srt/layers/attention/attention_registry.py"
TRITON_BACKEND = "srt/layers/attention/triton_backend.py"
OUR_BACKEND = "DDTreeTritonAttnBackend"


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str = ""


def _module_ast(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def extract(path: Path, names: list[str], namespace: dict) -> dict:
    """Execute the named top-level functions / classes / assignments of `path` in `namespace` (functions'
    decorators dropped; classes keep theirs, e.g. @dataclass, which `namespace` must supply)."""
    body = []
    for node in _module_ast(path).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            body.append(node)
        elif (isinstance(node, ast.ClassDef) and node.name in names) or (
                isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets)):
            body.append(node)
    found = {n.targets[0].id if isinstance(n, ast.Assign) else n.name for n in body}
    missing = set(names) - found
    if missing:
        raise LookupError(f"{path}: no top-level {', '.join(sorted(missing))}")
    # Annotations stay strings (as under the module's own `from __future__ import annotations`), so
    # the names they use need not be in `namespace`.
    code = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return namespace


@contextlib.contextmanager
def env(**values: str | None) -> Iterator[None]:
    from ddtree_ops.module_stand_ins import put

    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        put(os.environ, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            put(os.environ, k, v)


def run_checks(checks: list[tuple[str, Callable[[], str | None]]], modules: dict[str, dict]) -> list[CheckResult]:
    """Run each (name, fn) with `modules` stood in; an exception is a failed check, not a crash."""
    from ddtree_ops.module_stand_ins import stand_in_modules

    results = []
    for name, fn in checks:
        try:
            with stand_in_modules(modules):
                detail = fn()
            results.append(CheckResult(name, True, detail or ""))
        except Exception as exc:  # a failed expectation is a result for the matrix
            results.append(CheckResult(name, False, f"{type(exc).__name__}: {exc}"))
    return results


def named_backend(name: str, **attrs) -> object:
    """An instance of a class called `name` (the policy only reads the class name)."""
    return type(name, (), attrs)()


def _policy_stand_ins() -> dict[str, dict]:
    class ForwardMode:  # sglang.srt.model_executor.forward_batch_info.ForwardMode, as the policy uses it
        TARGET_VERIFY = "TARGET_VERIFY"

    class HybridAttnBackend:
        def __init__(self, verify_backend):
            self._verify = verify_backend

        def _select_backend(self, mode):
            assert mode == ForwardMode.TARGET_VERIFY
            return self._verify

    class TboAttnBackend:
        def __init__(self, primary):
            self.primary = primary

    return {
        "sglang.srt.layers.attention.hybrid_attn_backend": {"HybridAttnBackend": HybridAttnBackend},
        "sglang.srt.layers.attention.tbo_backend": {"TboAttnBackend": TboAttnBackend},
        "sglang.srt.model_executor.forward_batch_info": {"ForwardMode": ForwardMode},
    }


def _wrap_full(inner: object, levels: int) -> object:
    for i in range(levels):
        inner = type(f"HybridLinearAttnBackend{i}", (), {"full_attn_backend": inner})()
    return inner


def policy_checks(tree: SglangTree) -> list[CheckResult]:
    """The patched resolve_dflash_verify_mask_policy on chains, trees, wrappers and our backend."""
    from ddtree_kernels.sglang import TreeVerifyBackendError

    ns = extract(tree.package / DFLASH_UTILS, ["resolve_dflash_verify_mask_policy",
                                                "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"], {"Any": object})
    resolve: Callable = ns["resolve_dflash_verify_mask_policy"]
    skip: frozenset = ns["_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"]
    stand_ins = _policy_stand_ins()

    def chain_unchanged():
        with env(DDTREE_TREE_VERIFY="0"):
            for name in sorted(skip | {"FlashMLABackend", "CutlassMLABackend", "AscendAttnBackend"}):
                got = resolve(named_backend(name))
                assert got == (name, name not in skip), f"{name}: {got}"
        return f"{len(skip)} skip-listed + 3 other backends answer as before"

    def tree_forces_mask_on_triton():
        with env(DDTREE_TREE_VERIFY="1"):
            assert resolve(named_backend("TritonAttnBackend")) == ("TritonAttnBackend", True)
            assert resolve(named_backend("FlashMLABackend")) == ("FlashMLABackend", True)

    def tree_refuses_unmaskable():
        refused = []
        with env(DDTREE_TREE_VERIFY="1", DDTREE_MASK_CAPABLE_BACKENDS=None):
            for name in sorted(skip - {"TritonAttnBackend"}):
                try:
                    resolve(named_backend(name))
                except TreeVerifyBackendError as exc:
                    assert name in str(exc) and "--attention-backend triton" in str(exc), str(exc)
                    refused.append(name)
                else:
                    raise AssertionError(f"tree verify on {name} was not refused")
        return "refused: " + ", ".join(refused)

    def wrappers_unwrap():
        with env(DDTREE_TREE_VERIFY="0"):
            assert resolve(_wrap_full(named_backend("FlashAttentionBackend"), 3)) == ("FlashAttentionBackend", False)
            assert resolve(_wrap_full(named_backend("FlashMLABackend"), 2)) == ("FlashMLABackend", True)
        with env(DDTREE_TREE_VERIFY="1"):
            assert resolve(_wrap_full(named_backend("TritonAttnBackend"), 3)) == ("TritonAttnBackend", True)
        source = (tree.package / DFLASH_UTILS).read_text()
        if "HybridAttnBackend" in source:  # 0.5.23+: also through HybridAttnBackend / TboAttnBackend
            h = sys.modules["sglang.srt.layers.attention.hybrid_attn_backend"].HybridAttnBackend  # the stand-ins
            t = sys.modules["sglang.srt.layers.attention.tbo_backend"].TboAttnBackend
            with env(DDTREE_TREE_VERIFY="1"):
                inner = t(h(_wrap_full(named_backend("TritonAttnBackend"), 1)))
                assert resolve(inner) == ("TritonAttnBackend", True)
            return "full_attn_backend chains, HybridAttnBackend and TboAttnBackend"
        return "full_attn_backend chains"

    def our_backend():
        with env(DDTREE_TREE_VERIFY="0"):
            assert resolve(named_backend(OUR_BACKEND)) == (OUR_BACKEND, False)  # chain: causal path, like Triton
        with env(DDTREE_TREE_VERIFY="1"):
            assert resolve(named_backend(OUR_BACKEND)) == (OUR_BACKEND, True)

    def auto_from_command_line():
        saved = sys.argv
        try:
            with env(DDTREE_TREE_VERIFY=None):
                sys.argv = ["sglang.launch_server", "--speculative-algorithm", "DDTREE", "--page-size", "1"]
                assert resolve(named_backend("TritonAttnBackend")) == ("TritonAttnBackend", True)
                sys.argv = ["sglang.launch_server", "--speculative-algorithm=DFLASH"]  # a chain: SGLang's own answer
                expected = "TritonAttnBackend" not in skip  # releases skip-list Triton; the older ddtree branch not
                assert resolve(named_backend("TritonAttnBackend")) == ("TritonAttnBackend", expected)
        finally:
            sys.argv = saved

    return run_checks([
        ("policy: chain verify unchanged", chain_unchanged),
        ("policy: tree forces the mask on Triton", tree_forces_mask_on_triton),
        ("policy: tree refused on a backend that cannot mask", tree_refuses_unmaskable),
        ("policy: wrappers unwrap to the verify backend", wrappers_unwrap),
        ("policy: our backend is mask-capable", our_backend),
        ("policy: auto mode reads --speculative-algorithm", auto_from_command_line),
    ], stand_ins)


def _uses_verify_mask_struct(tree: SglangTree) -> bool:
    """0.5.18+ keeps the captured verify mask in a VerifyMask sized n * (context + n) per request."""
    return "self._verify_mask = maybe_create_verify_mask(" in (tree.package / TRITON_BACKEND).read_text()


def _triton_stand_in(new_layout: bool, max_context_len: int = 1000, num_draft_tokens: int = 9) -> type:
    """TritonAttnBackend as far as the routing touches it (held to the real one by contract_checks)."""
    import torch

    def sglang_own_verify(*args, **kwargs):
        return False

    class TritonAttnBackend:
        def __init__(self, model_runner):
            self.model_runner = model_runner
            self.device = "cpu"
            self.max_context_len = max_context_len
            self.num_draft_tokens = num_draft_tokens
            self.use_verify_splitkv = False
            self.use_verify_shared_kv = False
            self.verify_splitkv_fwd = sglang_own_verify
            self.cuda_graph_custom_mask = None
            self._verify_mask = None

        def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None, cuda_graph_num_kv_splits_buf=None):
            if new_layout:  # verify_mask.tree_mask_numel(FULL_MASK, ...)
                n = self.num_draft_tokens
                self._verify_mask = types.SimpleNamespace(
                    buffer=torch.zeros(max_bs * n * (self.max_context_len + n), dtype=torch.uint8))
            else:  # 0.5.14-0.5.17: max_num_tokens * max_context_len
                self.cuda_graph_custom_mask = torch.zeros(max_num_tokens * self.max_context_len, dtype=torch.uint8)

    TritonAttnBackend.sglang_own_verify = staticmethod(sglang_own_verify)
    return TritonAttnBackend


def routing_checks(tree: SglangTree) -> list[CheckResult]:
    """The patched create_triton_backend: our subclass by default, SGLang's with the switch off."""
    from ddtree_kernels.sglang import sglang_verify_fwd

    ns = extract(tree.package / REGISTRY, ["create_triton_backend"], {})
    create = ns["create_triton_backend"]
    new_layout = _uses_verify_mask_struct(tree)
    base = _triton_stand_in(new_layout)
    # Releases with VerifyMask (0.5.18+) have no DDTree: a DFlash server. The others (0.5.14-0.5.17 and the
    # DDTree branches, which size the mask max_num_tokens * max_context_len): DDTree at budget 64, block 16.
    algorithm = "DFLASH" if new_layout else "DDTREE"
    runner = types.SimpleNamespace(model_config=types.SimpleNamespace(is_encoder_decoder=False),
                                   server_args=types.SimpleNamespace(speculative_algorithm=algorithm,
                                                                     speculative_num_draft_tokens=9,
                                                                     speculative_ddtree_budget=64))
    modules = {"sglang.srt.layers.attention.triton_backend": {"TritonAttnBackend": base}}

    def default_routes_to_ddtree():
        with env(DDTREE_VERIFY_KERNEL=None):
            b = create(runner)
        assert type(b).__name__ == OUR_BACKEND and isinstance(b, base), type(b)
        assert b.use_verify_splitkv is True and b.use_verify_shared_kv is False
        assert b.verify_splitkv_fwd.__func__ is type(b)._ddtree_verify, b.verify_splitkv_fwd
        hook = getattr(type(b).ddtree_verify_hook, "__wrapped__", type(b).ddtree_verify_hook)
        assert hook is sglang_verify_fwd, hook
        return "TARGET_VERIFY -> ddtree_kernels.sglang.sglang_verify_fwd"

    def switch_off_keeps_sglang():
        with env(DDTREE_VERIFY_KERNEL="sglang"):
            b = create(runner)
        assert type(b) is base and b.use_verify_splitkv is False
        assert b.verify_splitkv_fwd is base.sglang_own_verify

    def graph_mask_sized_for_tree():
        with env(DDTREE_VERIFY_KERNEL="ddtree"):
            b = create(runner)
        width = 9 if new_layout else 64 + 1  # DDTree verifies budget + 1 tokens a request, not the block's 9
        b.init_cuda_graph_state(4, 4 * width)
        need = 4 * width * (1000 + width)
        mask = b._verify_mask.buffer if new_layout else b.cuda_graph_custom_mask
        assert mask.numel() >= need, mask.numel()
        kind = "VerifyMask" if new_layout else "cuda_graph_custom_mask"
        return f"{kind}: {mask.numel()} bytes, {4 * width} tokens at 1000"

    def bad_switch_is_named():
        with env(DDTREE_VERIFY_KERNEL="fast"):
            try:
                create(runner)
            except ValueError as exc:
                assert "DDTREE_VERIFY_KERNEL" in str(exc)
            else:
                raise AssertionError("DDTREE_VERIFY_KERNEL=fast was accepted")

    return run_checks([
        ("routing: default routes TARGET_VERIFY to ddtree_kernels", default_routes_to_ddtree),
        ("routing: DDTREE_VERIFY_KERNEL=sglang keeps SGLang's path", switch_off_keeps_sglang),
        ("routing: CUDA-graph mask buffer fits a tree at full context", graph_mask_sized_for_tree),
        ("routing: an unknown switch value is an error", bad_switch_is_named),
    ], modules)


def contract_checks(tree: SglangTree) -> list[CheckResult]:
    """The real TritonAttnBackend of this release has what the routing and the stand-in rely on."""
    source = (tree.package / TRITON_BACKEND).read_text()
    cls = next((n for n in _module_ast(tree.package / TRITON_BACKEND).body
                if isinstance(n, ast.ClassDef) and n.name == "TritonAttnBackend"), None)
    if cls is None:
        return [CheckResult("contract: TritonAttnBackend exists", False, "class not found")]
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    results = []

    def calls_hook(fn: ast.FunctionDef) -> int:
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "verify_splitkv_fwd"):
                return len(node.args)
        return -1

    fe = methods.get("forward_extend")
    n_args = calls_hook(fe) if fe else -1
    # 0.5.18+ picks the hook into a local (verify_fwd = self.verify_splitkv_fwd) and calls that.
    if n_args < 0 and fe is not None:
        for node in ast.walk(fe):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "verify_fwd":
                n_args = len(node.args)
    results.append(CheckResult("contract: forward_extend calls the verify hook with 16 positional arguments",
                               n_args == 16, f"{n_args} positional arguments" if n_args >= 0 else
                               "forward_extend never calls self.verify_splitkv_fwd (a backend older than the hook)"))
    for attr in ("use_verify_splitkv", "verify_splitkv_fwd", "max_context_len", "num_draft_tokens", "device"):
        results.append(CheckResult(f"contract: TritonAttnBackend sets self.{attr}", f"self.{attr} =" in source,
                                   f"no `self.{attr} =` in {TRITON_BACKEND}"))
    if _uses_verify_mask_struct(tree):
        sizing = (tree.package / "srt/layers/attention/verify_mask.py").read_text()
        ok = "num_draft_tokens * (max_context_len + num_draft_tokens)" in sizing
        results.append(CheckResult("contract: VerifyMask holds n * (context + n) per request (a full tree)", ok))
    else:
        results.append(CheckResult("contract: captured mask is self.cuda_graph_custom_mask (resized by our backend)",
                                   "self.cuda_graph_custom_mask =" in source))
    init = methods.get("init_cuda_graph_state")
    params = [a.arg for a in init.args.args[:3]] if init else []
    results.append(CheckResult("contract: init_cuda_graph_state(self, max_bs, max_num_tokens, ...)",
                               params == ["self", "max_bs", "max_num_tokens"], str(params)))
    return results


def ddtree_checks(tree: SglangTree) -> list[CheckResult]:
    """On DDTree sources: DDTree's own verify path takes our backend, and its accept path fits the tree."""
    import dataclasses

    from ddtree_kernels.sglang.triton_backend import ddtree_backend_class

    results = []
    if (tree.package / DDTREE_UTILS).is_file():
        ns = extract(tree.package / DDTREE_UTILS, ["DDTreeTargetBackendCapability",
                                                   "resolve_ddtree_target_backend_capability"],
                     {"dataclass": dataclasses.dataclass, "Any": object})
        resolve = ns["resolve_ddtree_target_backend_capability"]

        compact = "ddtree_verify_takes_visibility" in (tree.package / DDTREE_UTILS).read_text()

        def ddtree_feeds_our_backend():
            # DDTree picks how to feed a backend by its module's name: ours must read as a Triton backend;
            # with 0004 it asks the backend first, and ours takes the compact visibility (no flat mask).
            backend = object.__new__(ddtree_backend_class(_triton_stand_in(False)))
            cap = resolve(backend)
            assert cap.supports_full_tree, cap
            if compact:
                assert cap.use_visibility and not cap.build_attention_mask, cap
                return f"{cap.backend_name}: the compact visibility (0004)"
            assert cap.build_attention_mask and not cap.use_visibility, cap
            return f"{cap.backend_name}: the flat tree mask"

        def others_fed_as_before():
            # 0004 changes nothing for SGLang's own backends: its Triton and FlashAttention keep their feed.
            triton = resolve(named_backend("TritonAttnBackend", __module__="x.triton_backend"))
            fa = resolve(named_backend("FlashAttentionBackend", __module__="x.flashattention_backend"))
            assert triton.build_attention_mask and not triton.use_visibility, triton
            assert fa.use_visibility and not fa.build_attention_mask, fa
            return "triton: the flat mask; flashattention: the visibility"

        results += run_checks([("ddtree: full-tree verify accepts our backend", ddtree_feeds_our_backend),
                               ("ddtree: other backends fed as before", others_fed_as_before)], {})
        if compact:
            results += _compact_feed_contract(tree)
    if (tree.package / DDTREE_WORKER_V2).is_file():
        from ddtree_kernels.sglang import replaces_kv_fill

        cls = next(n for n in _module_ast(tree.package / TRITON_BACKEND).body
                   if isinstance(n, ast.ClassDef) and n.name == "TritonAttnBackend")
        fill = next((n for n in cls.body if isinstance(n, ast.FunctionDef)
                     and n.name == "_fill_kv_indptr_and_indices"), None)
        results.append(CheckResult("ddtree v2: our backend takes over the KV index fill (same statements as SGLang's)",
                                   replaces_kv_fill(fill), ast.unparse(fill)[:300] if fill else "no such method"))
        fn = next(n for n in ast.walk(_module_ast(tree.package / DDTREE_WORKER_V2))
                  if isinstance(n, ast.FunctionDef) and n.name == "forward_batch_generation")
        widths = [ast.unparse(n.value) for n in ast.walk(fn) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "path_width" for t in n.targets)]
        results.append(CheckResult("ddtree v2: the accepted path is no wider than the verified tree (0003)",
                                   widths == ["min(int(self.block_size), q_len)"], "; ".join(widths)))
        syncs = host_syncs(_module_ast(tree.package / DDTREE_WORKER_V2), "DDTreeWorkerV2", VERIFY_STEP)
        results.append(CheckResult("ddtree v2: no host sync in the verify step (0005)", not syncs,
                                   "; ".join(syncs) or f"{', '.join(VERIFY_STEP)}: none outside {', '.join(OFF_PATH)}"))
        calls = mla_move_calls(_module_ast(tree.package / MEMORY_POOL))
        results.append(CheckResult("ddtree v2: the MLA pool moves every layer's rows in one launch (0006)",
                                   "copy_all_layer_kv_cache_func" in calls.get("_move_kv_cache_all_layers", [])
                                   and "self._move_kv_cache_all_layers" in calls.get("move_kv_cache", []),
                                   "; ".join(f"{fn}: {', '.join(c)}" for fn, c in calls.items())[:300]))
        results += dsa_checks(tree)
    return results


def _method(module: ast.Module, cls_name: str, name: str) -> ast.FunctionDef | None:
    cls = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None) if cls else None


def _function(module: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def dsa_checks(tree: SglangTree) -> list[CheckResult]:
    """0007: a DSA model at DDTree's page size 1. The indexer stages its queries for a backend that has the hook
    (before it ranks anything), the DSA pool and its key store take page size 1, the page-size override keeps
    1 under DDTREE with the Triton backend, and the Triton dispatch keeps fresh prompts on the MLA path for a
    backend that serves the sparse prefill."""
    forward = _method(_module_ast(tree.package / DSA_INDEXER), "Indexer", "forward_cuda")
    calls = [ast.unparse(n.func) for n in ast.walk(forward) if isinstance(n, ast.Call)] if forward else []
    staged = "ddtree_stage" in calls and calls.index("ddtree_stage") < calls.index("self._get_topk_paged")
    pool_init = _method(_module_ast(tree.package / MEMORY_POOL), "DSATokenToKVPool", "__init__")
    asserts = [ast.unparse(n.test) for n in ast.walk(pool_init) if isinstance(n, ast.Assert)] if pool_init else []
    overrides = (tree.package / OVERRIDES).read_text()
    keeps_one = 'overrides["page_size"] = 1' in overrides and '== "DDTREE"' in overrides
    triton = _function(_module_ast(tree.package / DEEPSEEK_DISPATCH), "handle_attention_triton")
    asks = triton is not None and "ddtree_dsa_prefill" in ast.unparse(triton)
    return [
        CheckResult("ddtree v2 DSA: the indexer stages its queries for our backend before ranking keys (0007)",
                    staged, ", ".join(c for c in calls if c in ("ddtree_stage", "self._get_topk_paged",
                                                                  "self._get_topk_ragged"))),
        CheckResult("ddtree v2 DSA: the DSA pool takes page size 1 on CUDA (0007)",
                    "self.page_size in (1, 64)" in asserts, "; ".join(asserts)[:300]),
        CheckResult("ddtree v2 DSA: the page-size override keeps 1 under DDTREE (0007)", keeps_one,
                    "found" if keeps_one else f"no DDTREE page-size-1 branch in {OVERRIDES}"),
        CheckResult("ddtree v2 DSA: a fresh prompt takes the MLA path where our backend serves the sparse prefill "
                    "(0007)", asks, "found" if asks else f"handle_attention_triton in {DEEPSEEK_DISPATCH} does "
                    "not ask ddtree_dsa_prefill"),
    ]


def mla_move_calls(module: ast.Module) -> dict[str, list[str]]:
    """What MLATokenToKVPool's move methods call (the launch-per-layer loop calls nothing of note)."""
    cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "MLATokenToKVPool")
    return {fn.name: [ast.unparse(c.func) for c in ast.walk(fn) if isinstance(c, ast.Call)]
            for fn in cls.body if isinstance(fn, ast.FunctionDef)
            and (fn.name == "move_kv_cache" or fn.name.startswith("_move_kv_cache"))}


# The DDTree step's host code, and the branches it runs only off the served path: a flat mask (not built for
# our backend), the step profiler, the first step's log line.
VERIFY_STEP = ("forward_batch_generation", "_build_verify_input")
OFF_PATH = ("build_attention_mask", "profiler.enabled", "_logged_first_verify")
SYNC_METHODS = {"item", "tolist", "cpu"}


def host_syncs(module: ast.Module, cls_name: str, functions: tuple[str, ...]) -> list[str]:
    """Calls in `cls_name`'s `functions` that copy device values to the host (.item(), .tolist(), .cpu(),
    .to("cpu")), so stall the step until the GPU catches up, outside a branch that runs only off the path."""
    cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    found = []

    def walk(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.If) and any(flag in ast.unparse(node.test) for flag in OFF_PATH):
            for child in node.orelse:
                walk(child, where)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in SYNC_METHODS or (node.func.attr == "to" and any(
                    isinstance(a, ast.Constant) and a.value == "cpu" for a in node.args))):
            found.append(f"{where} line {node.lineno}: {ast.unparse(node)[:80]}")
        for child in ast.iter_child_nodes(node):
            walk(child, where)

    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in functions:
            walk(fn, fn.name)
    return found


def _compact_feed_contract(tree: SglangTree) -> list[CheckResult]:
    """What our backend relies on when fed the visibility: the graph hook it overrides, and SGLang's fallback
    reading forward_metadata.custom_mask after the verify hook declines (the backend writes it then)."""
    cls = next(n for n in _module_ast(tree.package / TRITON_BACKEND).body
               if isinstance(n, ast.ClassDef) and n.name == "TritonAttnBackend")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    out_graph = methods.get("init_forward_metadata_out_graph")
    params = [a.arg for a in out_graph.args.args] if out_graph else []
    fallback = [ast.unparse(a) for node in ast.walk(methods["forward_extend"]) if isinstance(node, ast.Call)
                and ast.unparse(node.func) == "self.extend_attention_fwd" for a in node.args]
    return [
        CheckResult("contract: init_forward_metadata_out_graph(self, forward_batch, in_capture)",
                    params == ["self", "forward_batch", "in_capture"], str(params)),
        CheckResult("contract: SGLang's fallback reads self.forward_metadata.custom_mask after the hook",
                    "self.forward_metadata.custom_mask" in fallback, ", ".join(fallback[9:10])),
    ]


def all_checks(tree: SglangTree) -> list[CheckResult]:
    return contract_checks(tree) + policy_checks(tree) + routing_checks(tree) + ddtree_checks(tree)
