"""A real SGLang server on the GPU: the production launch with our patches and kernel, measured whole.

    python -m tests.server_gpu.e2e --kernel ddtree,sglang --out DIR     (make test-server-gpu)

On a CUDA machine, from what `make gpu-carry` packed into `.gpu/` on a machine with a package index:
1. a venv (over the machine's torch and Triton) with the release bundle's wheels (SGLang built from the
   pinned DDTree commit, ddtree_kernels, ddtree-ops) and SGLang's missing dependencies; our patch tool
   applies the patch set to that SGLang, as the deploy does;
2. the models of `models.py` (GLM-5's per-GPU attention, random weights, a DFlash drafter, a local
   tokenizer), and the dense-MLA view the deploy makes (`ddtree-ops model-view`);
3. for each algorithm and kernel (`DDTREE_VERIFY_KERNEL`): `python -m sglang.launch_server` with the
   argument vector and env file the role renders for production (`.gpu/launch/ct200`), only the model
   paths, TP size, port and this machine's folders replaced; CUDA graphs on (the default). `--algorithm
   DFLASH` serves the same drafter as a chain (its checkpoint's block), the tree's step cost's yardstick;
4. against it: the real answers the stand-in server is checked against (`answers.json`), `ddtree-ops
   smoke` (`--verify-stats` for our kernel), greedy tokens at 8k and 128k for the same-token check,
   `ddtree-ops bench` at 8k-185k, and SGLang's torch profiler over a few decode steps at 8k and 185k;
5. where the two servers' greedy tokens part, the tie check (`tie_check`): the same model served without
   speculative decoding gives its top-2 log-probabilities there (report.py applies the near-tie rule).
   `--attention dsa` serves the DSA checkpoint itself (patch 0007); with `--reference` SGLang's own DSA serving
   (no speculation, its DSA backend) gives the greedy tokens that run is held to (`sglang-dsa`), and, being the
   tie check's server too, answers the tie check itself (one server start fewer). `--kernel= --reference` runs
   the reference alone, against a DSA run already in DIR (a second call on a warm machine).
Everything lands in DIR/<run>/ (<kernel> for DDTREE, <kernel>-dflash for DFLASH);
`python -m tests.server_gpu.report` turns the runs into `server-e2e-h200.json` and its plot. A stage that
fails is recorded and the run goes on where it can; the exit status is non-zero if anything failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import requests

from . import corpus
from .models import DEFAULT_STAND_IN, STAND_INS
from .report import first_difference

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / ".gpu"
VENV = GPU / "venv"
PY = VENV / "bin" / "python"
OPS = VENV / "bin" / "ddtree-ops"
LAUNCH = GPU / "launch" / "ct200"
CONTEXTS = [8192, 32768, 65536, 131072, 185000]
SAME_TOKEN_CONTEXTS = [8192, 131072]
PROFILE_CONTEXTS = [8192, 185000]
REPLACED = {"--model-path", "--speculative-draft-model-path", "--tp", "--port"}
TRAINED = "trained"  # the stand-in train_pair.py trains (make train-pair); the others are models.py's random ones
# Which prompts the stages send: the random ids ddtree-ops bench draws, or the trained pair's copy prompts
# (corpus.serve_prompt). main() sets it from --stand-in.
PROMPTS = {"trained": False}


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list, what: str, **kwargs) -> subprocess.CompletedProcess:
    log(f"{what}: {' '.join(shlex.quote(str(c)) for c in cmd)[:300]}")
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    if proc.returncode:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc


# --- 1. install ---------------------------------------------------------------------------------

def setup() -> dict:
    """The venv with the bundle's wheels and patches applied (once per machine; kept while it stays warm)."""
    done = VENV / ".complete"
    cached = GPU / "triton-cache.tar.gz"  # a previous run's compiled kernels, carried back: a faster start
    if cached.exists() and not (GPU / "triton-cache").exists():
        with tarfile.open(cached) as tf:
            tf.extractall(GPU, filter="data")
    if done.exists():
        return json.loads(done.read_text())
    wheels = GPU / "wheels"
    wheels.mkdir(exist_ok=True)
    with tarfile.open(GPU / "wheels.tar.xz") as tf:
        tf.extractall(wheels, filter="data")
    run([sys.executable, "-m", "venv", "--without-pip", VENV], "creating the venv")
    # The image's own packages (torch, Triton, CUDA) come after the venv's: its python may itself be a venv,
    # which `venv --system-site-packages` would skip.
    purelib = run([PY, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  "site-packages").stdout.strip()
    (Path(purelib) / "_gpu_image.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run([sys.executable, "-m", "pip", "--python", PY, "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
         "--disable-pip-version-check", *sorted(wheels.glob("*.whl"))], "installing the wheels")
    patch = json.loads(run([OPS, "patch", "apply", purelib, "--patches", GPU / "patches", "--json"],
                           "applying the patch set").stdout)
    record = {"purelib": purelib, "patch": patch, "carry": json.loads((GPU / "carry.json").read_text())}
    done.write_text(json.dumps(record, indent=1))
    return record


def gpu_description() -> str:
    """The card and the stack that ran the server, for the report (the device tool may lend an H100 or an H200)."""
    probe = ("import torch, triton; p = torch.cuda.get_device_properties(0); "
             "print(f'{p.name} (sm_{p.major}{p.minor}), torch {torch.__version__}, Triton {triton.__version__}')")
    return run([PY, "-c", probe], "the GPU").stdout.strip()


def train_models(root: Path, train_args: list[str]) -> dict:
    """The trained pair (train_pair.py) into root, unless a previous call left it there; its measures."""
    if not (root / ".complete").exists():
        cmd = [PY, "-m", "tests.server_gpu.train_pair", "--out", root, *train_args]
        log(f"training the pair: {' '.join(map(str, cmd))}")
        proc = subprocess.run([str(c) for c in cmd], cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode:
            raise RuntimeError(f"training the pair failed ({proc.returncode})")
    return json.loads((root / "train.json").read_text())


def make_models(stand_in: str, train_args: list[str] = ()) -> dict[str, Path]:
    root = GPU / f"models-{stand_in}"
    paths = {"target": root / "target", "drafter": root / "drafter", "view": root / "target-dense-mla"}
    if stand_in == TRAINED:
        train_models(root, list(train_args))
    elif not (root / ".complete").exists():
        run([PY, "-c", "from tests.server_gpu.models import make_models; from pathlib import Path; "
             f"make_models(Path({str(root)!r}), stand_in={stand_in!r})"], f"making the {stand_in} models", cwd=REPO)
        (root / ".complete").touch()
    view = json.loads(run([OPS, "model-view", paths["target"], paths["view"], "--json"], "dense-MLA view").stdout)
    log(f"view: {view}")
    return paths


# --- 2. the server ------------------------------------------------------------------------------

def production_launch() -> tuple[str, list[str], dict[str, str]]:
    """The role's rendered launch (module, argument vector) and env file (playbooks/server-args.yml,
    inventory/production)."""
    launch = json.loads((LAUNCH / "launch.json").read_text())
    module, argv = launch["module"], launch["argv"]
    env = {}
    for line in (LAUNCH / "sglang.env").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            env[name] = value.strip().strip('"')
    env.setdefault("DDTREE_SERVER_MODULE", module)
    return module, argv, env


def replace_args(argv: list[str], values: dict[str, str]) -> list[str]:
    out = list(argv)
    for flag, value in values.items():
        if flag not in out:
            raise ValueError(f"the production launch has no {flag}")
        out[out.index(flag) + 1] = value
    return out


def drop_flags(argv: list[str], prefix: str) -> list[str]:
    """The argument vector without every flag starting with `prefix` and the values that follow it."""
    out, dropping = [], False
    for arg in argv:
        if arg.startswith("--"):
            dropping = arg.startswith(prefix)
        if not dropping:
            out.append(arg)
    return out


def chain_args(argv: list[str]) -> list[str]:
    """The launch with the same drafter as a DFlash chain: DDTREE's own flags dropped, its block from the
    drafter's checkpoint."""
    return replace_args(drop_flags(argv, "--speculative-ddtree-"), {"--speculative-algorithm": "DFLASH"})


def run_name(kernel: str, algorithm: str, attention: str = "dense-view", budget: int | None = None) -> str:
    """<kernel>[-b<budget>][-dflash][-dsa]: a DDTREE budget other than the production launch's is named."""
    name = kernel if algorithm == "DDTREE" else f"{kernel}-{algorithm.lower()}"
    if budget is not None and algorithm == "DDTREE":
        name = f"{kernel}-b{budget}"
    return f"{name}-dsa" if attention == "dsa" else name


def production_budget() -> int:
    """The DDTree node budget the production launch serves (--speculative-ddtree-budget)."""
    argv = production_launch()[1]
    return int(argv[argv.index("--speculative-ddtree-budget") + 1])


def plain_args(argv: list[str], attention: str = "dense-view") -> list[str]:
    """The launch without speculative decoding (and without CUDA graphs: it only prefills), which SGLang lets
    return log-probabilities (DDTree refuses return_logprob). For a DSA checkpoint: SGLang's own DSA serving
    (its dsa backend and page size, chosen by SGLang; DeepGEMM and FlashMLA must be installed)."""
    plain = drop_flags(argv, "--speculative-")
    if attention == "dsa":
        plain = drop_flags(drop_flags(plain, "--attention-backend"), "--page-size")
    return [*plain, "--disable-cuda-graph"]


class Server:
    def __init__(self, kernel: str, models: dict[str, Path], run_dir: Path, port: int = 30000,
                 speculative: bool = True, algorithm: str = "DDTREE", extra: list[str] = (),
                 attention: str = "dense-view", budget: int | None = None):
        module, argv, env = production_launch()
        sglang_dsa = not speculative and attention == "dsa"  # SGLang's own DSA serving (reference, tie check)
        if sglang_dsa:
            env |= REFERENCE_ENV
        # dense-view: the dense-MLA view the production inventory serves; dsa: the DSA checkpoint itself
        # (ddtree_dsa_attention: dsa, patch 0007)
        model = models["target"] if attention == "dsa" else models["view"]
        self.argv = replace_args(argv, {"--model-path": str(model),
                                        "--speculative-draft-model-path": str(models["drafter"]),
                                        "--tp": "1", "--port": str(port)})
        if algorithm == "DFLASH":
            self.argv = chain_args(self.argv)
        elif budget is not None:
            self.argv = replace_args(self.argv, {"--speculative-ddtree-budget": str(budget)})
        self.argv += list(extra) + (REFERENCE_ARGS if sglang_dsa else [])
        if not speculative:
            self.argv = plain_args(self.argv, attention)
        self.url = f"http://127.0.0.1:{port}"
        self.stats = run_dir / "verify-stats"
        self.stats.mkdir(parents=True, exist_ok=True)
        for f in self.stats.glob("*"):
            f.unlink()
        for unit_only in ("DDTREE_SERVER_MODULE", "DDTREE_SERVER_ARGS", "DDTREE_AUTH_ARGS", "DDTREE_API_KEY"):
            env.pop(unit_only, None)  # the unit's own plumbing; the test server runs without an API key
        home = GPU / "home"
        env |= {"DDTREE_VERIFY_KERNEL": kernel, "DDTREE_VERIFY_STATS_DIR": str(self.stats), "HOME": str(home),
                "XDG_CACHE_HOME": str(home / "cache"), "HF_HOME": str(home / "cache" / "huggingface"),
                "TRITON_CACHE_DIR": str(GPU / "triton-cache"), "HF_HUB_OFFLINE": "1"}
        self.env = env
        self.cmd = [str(PY), "-m", module, *self.argv]
        self.log_path = run_dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.health: list[dict] = []  # every distinct health answer while it started (the stand-in's model)

    def start(self, timeout_s: float) -> float:
        log(f"starting: {' '.join(self.cmd)}")
        log(f"env: {json.dumps(self.env)}")
        t0 = time.monotonic()
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                         cwd=GPU, start_new_session=True)
        seen = set()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}) while starting:\n{self.tail()}")
            try:
                resp = requests.get(self.url + "/health_generate", timeout=30)
                key = (resp.status_code, resp.text[:200])
                if key not in seen:
                    seen.add(key)
                    self.health.append({"after_s": round(time.monotonic() - t0, 1), "status": resp.status_code,
                                        "body": resp.text[:200], "content_type": resp.headers.get("content-type")})
                if resp.status_code == 200:
                    return time.monotonic() - t0
            except requests.RequestException:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"not healthy after {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


# --- 3. what is measured ------------------------------------------------------------------------

def record_answers(url: str) -> dict:
    """The real server's answers to what the smoke and bench clients send (the stand-in is held to them)."""
    out: dict = {}
    s = requests.Session()
    out["models"] = s.get(url + "/v1/models", timeout=60).json()
    info = s.get(url + "/server_info", timeout=60)
    out["server_info"] = info.json() if info.status_code == 200 else {"status": info.status_code}
    chat = {"model": "glm-5", "messages": [{"role": "user", "content": "w10 w20 w30"}], "temperature": 0,
            "max_tokens": 16}
    out["chat"] = s.post(url + "/v1/chat/completions", json=chat, timeout=120).json()
    stream = s.post(url + "/v1/chat/completions", timeout=120, stream=True,
                    json=chat | {"stream": True, "stream_options": {"include_usage": True}})
    out["chat_stream"] = [line for line in stream.iter_lines(decode_unicode=True) if line]
    gen = {"input_ids": list(range(100, 164)), "sampling_params": {"max_new_tokens": 16, "temperature": 0,
                                                                     "ignore_eos": True}, "stream": True}
    stream = s.post(url + "/generate", json=gen, timeout=120, stream=True)
    out["generate_stream"] = [line for line in stream.iter_lines(decode_unicode=True) if line]
    return out


def bench_prompt(context: int) -> list[int]:
    """The prompt `ddtree-ops bench` sends first at this context (concurrency 1, round 0, request 0): its
    prefix is cached, so the token and profile stages prefill nothing. Kept equal to
    ddtree_ops.throughput.prompt_ids (a test checks), which this machine's Python cannot import. For the
    trained pair, the copy prompt of its held-out text (corpus.serve_prompt), which its bench sends too."""
    import random

    if PROMPTS["trained"]:
        return corpus.serve_prompt(context)

    rng = random.Random(hash((context, 1, 0, 0)))
    return [rng.randrange(100, 32000) for _ in range(context)]


def greedy_tokens(url: str, context: int, n: int) -> list[int]:
    body = {"input_ids": bench_prompt(context), "sampling_params": {"max_new_tokens": n, "temperature": 0,
                                                                      "ignore_eos": True}}
    answer = requests.post(url + "/generate", json=body, timeout=900).json()
    return answer["output_ids"]


def profile(url: str, context: int, out_dir: Path, steps: int) -> dict:
    """SGLang's torch profiler (CPU + GPU, Python stacks) over `steps` decode steps of one request."""
    out_dir.mkdir(parents=True, exist_ok=True)
    body = {"input_ids": bench_prompt(context), "stream": True,
            "sampling_params": {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True}}
    t0 = time.monotonic()
    events = 0
    started = None
    with requests.post(url + "/generate", json=body, timeout=900, stream=True) as resp:
        for line in resp.iter_lines(decode_unicode=True):
            if not line:
                continue
            events += 1
            if started is None and events >= 3:  # the prefill is done and decode runs
                started = time.monotonic()
                r = requests.post(url + "/start_profile", timeout=120, json={
                    "output_dir": str(out_dir), "num_steps": steps, "activities": ["CPU", "GPU"],
                    "with_stack": True, "record_shapes": False, "profile_prefix": f"ctx{context}"})
                if r.status_code != 200:
                    raise RuntimeError(f"/start_profile answered {r.status_code}: {r.text[:300]}")
            traced = glob.glob(str(out_dir / "*.trace.json.gz"))
            if started is not None and (traced or time.monotonic() - started > 120):
                break
    deadline = time.monotonic() + 120
    while not glob.glob(str(out_dir / "*.trace.json.gz")) and time.monotonic() < deadline:
        time.sleep(1)
    traces = sorted(glob.glob(str(out_dir / "*.trace.json.gz")))
    if not traces:
        raise RuntimeError(f"no trace in {out_dir} after profiling {steps} steps")
    time.sleep(3)  # the exporter writes the file in one go; let it close
    return {"context": context, "steps": steps, "trace": traces[-1], "seconds": time.monotonic() - t0}


def first_differences(out: Path, attention: str = "dense-view") -> dict[str, int]:
    """Per context, the first index where the two servers' greedy tokens differ (tokens.json of each run):
    our kernel's DDTREE run against SGLang's, or against our DFLASH chain where SGLang's did not run."""
    ours, sglang, chain = (run_name(k, a, attention) for k, a in
                           (("ddtree", "DDTREE"), ("sglang", "DDTREE"), ("ddtree", "DFLASH")))
    target = reference_run_name(attention)
    other = next((r for r in (target, sglang) if (out / r / "tokens.json").exists()), chain)
    paths = [out / run for run in (ours, other)]
    paths = [p / "tokens.json" for p in paths]
    if not all(p.exists() for p in paths):
        return {}
    ours, theirs = (json.loads(p.read_text()) for p in paths)
    diffs = {ctx: first_difference(ours[ctx], theirs[ctx]) for ctx in set(ours) & set(theirs)}
    return {ctx: first for ctx, first in diffs.items() if first is not None}


def top2_at_differences(url: str, out: Path, diffs: dict[str, int], attention: str) -> dict[str, dict]:
    """Per context, a server without speculative decoding teacher-forced on our tokens up to their first
    difference: the log-probabilities of each of our tokens and the top 2 at each position (report.near_ties)."""
    ours = json.loads((out / run_name("ddtree", "DDTREE", attention) / "tokens.json").read_text())
    positions = {}
    for ctx, first in sorted(diffs.items(), key=lambda kv: int(kv[0])):
        prompt = bench_prompt(int(ctx))
        body = {"input_ids": prompt + ours[ctx][: first + 1], "return_logprob": True,
                "logprob_start_len": len(prompt) - 1, "top_logprobs_num": 2,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        meta = requests.post(url + "/generate", json=body, timeout=900).json()["meta_info"]
        positions[ctx] = {"prompt_len": len(prompt), "logprob_start_len": len(prompt) - 1,
                          "input_token_logprobs": meta["input_token_logprobs"],
                          "input_top_logprobs": meta["input_top_logprobs"]}
        log(f"tie check {ctx}: first difference at {first}")
    return positions


def tie_check(models: dict[str, Path], out: Path, deadline: float, attention: str = "dense-view") -> dict:
    """Where the two servers' greedy tokens part, the target's top-2 log-probabilities there from a third
    computation: the same model served without speculative decoding (SGLang's prefill attention, no verify),
    teacher-forced on our tokens. report.py applies the near-tie rule to what is recorded here."""
    diffs = first_differences(out, attention)
    result: dict = {"first_differences": diffs, "positions": {}}
    if not diffs:
        return result
    run_dir = out / "plain"
    run_dir.mkdir(parents=True, exist_ok=True)
    server = Server("ddtree", models, run_dir, speculative=False, attention=attention)
    result["argv"] = server.argv
    try:
        result["start_s"] = server.start(min(300, deadline - time.monotonic()))
        result["positions"] = top2_at_differences(server.url, out, diffs, attention)
    finally:
        server.stop()
        (run_dir / "ties.json").write_text(json.dumps(result, indent=1))
    return result


# SGLang's FlashMLA decode for its DSA reference: the default on Hopper (fa3) is in the 1.1 GB flash_ops that
# carry.py cuts from sglang-kernel.
REFERENCE_ARGS = ["--dsa-decode-backend", "flashmla_sparse"]
# and its FlashMLA sparse prefill for every prompt: below this many keys SGLang's DSA prefill otherwise runs dense
# MHA through the same cut FA3 (every key is in the top k there, so the two attend the same keys).
REFERENCE_ENV = {"SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0"}


def reference_run_name(attention: str) -> str:
    """The run without speculative decoding whose greedy tokens the speculative runs are held to: SGLang's own DSA
    serving for the DSA checkpoint (`sglang-dsa`), the target itself for the dense view (`target`)."""
    return "sglang-dsa" if attention == "dsa" else "target"


def reference_tokens(models: dict[str, Path], out: Path, deadline: float, args) -> dict:
    """The target served without speculative decoding, greedy: the tokens the speculative runs are held to. For the
    DSA checkpoint, SGLang's own way (its DSA backend at page size 64: DeepGEMM's indexer, FlashMLA's sparse
    attention; `sglang-dsa`); for the dense view, the same launch without speculation (`target`)."""
    name = reference_run_name(args.attention)
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    server = Server("sglang", models, run_dir, speculative=False, attention=args.attention)
    result: dict = {"kernel": "sglang", "algorithm": "none", "attention": args.attention, "argv": server.argv,
                    "failed": []}
    tokens: dict[str, list[int]] = {}
    try:
        result["start_s"] = server.start(min(args.start_timeout, deadline - time.monotonic()))
        for ctx in args.same_token_contexts:
            if time.monotonic() > deadline - 30:
                result["failed"].append(f"tokens {ctx}: skipped, out of time")
                continue
            tokens[str(ctx)] = greedy_tokens(server.url, ctx, args.same_tokens)
            log(f"reference tokens {ctx}: {tokens[str(ctx)][:8]}...")
        (run_dir / "tokens.json").write_text(json.dumps(tokens))
        # This server is the tie check's too (the target, no speculation): ask it while it is up rather than
        # start it again.
        diffs = first_differences(out, args.attention)
        if args.tie_check and diffs and time.monotonic() < deadline - 60:
            (out / "plain").mkdir(parents=True, exist_ok=True)
            ties = {"first_differences": diffs, "argv": server.argv, "served_by": name,
                    "positions": top2_at_differences(server.url, out, diffs, args.attention)}
            (out / "plain" / "ties.json").write_text(json.dumps(ties, indent=1))
            result["ties"] = ties
    except Exception as exc:
        result["failed"].append(f"{type(exc).__name__}: {exc}"[:4000])
        log(f"reference FAILED: {exc}")
    finally:
        server.stop()
        (run_dir / "tokens.json").write_text(json.dumps(tokens))
        (run_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def run_kernel(kernel: str, models: dict[str, Path], out: Path, deadline: float, args,
               algorithm: str = "DDTREE", budget: int | None = None) -> dict:
    """One server (kernel, algorithm, DDTREE budget: None is the production launch's) and every stage against it."""
    run_dir = out / run_name(kernel, algorithm, args.attention, budget)
    run_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"kernel": kernel, "algorithm": algorithm, "attention": args.attention, "failed": [],
                    "stages": {}, "budget": (budget or production_budget()) if algorithm == "DDTREE" else None}
    server = Server(kernel, models, run_dir, algorithm=algorithm, extra=args.server_args, attention=args.attention,
                    budget=budget)
    result["argv"] = server.argv
    result["env"] = server.env

    def stage(name: str, fn, min_left_s: float = 30):
        if time.monotonic() > deadline - min_left_s:
            result["failed"].append(f"{name}: skipped, out of time")
            log(f"{kernel}: {name} skipped (out of time)")
            return None
        t0 = time.monotonic()
        try:
            value = fn()
            result["stages"][name] = round(time.monotonic() - t0, 1)
            log(f"{kernel}: {name} done in {time.monotonic() - t0:.1f} s")
            return value
        except Exception as exc:
            result["failed"].append(f"{name}: {type(exc).__name__}: {exc}"[:4000])
            log(f"{kernel}: {name} FAILED: {exc}\n{traceback.format_exc()[-2000:]}")
            return None

    try:
        started = stage("start", lambda: server.start(min(args.start_timeout, deadline - time.monotonic())), 90)
        result["start_s"] = started
        result["health_while_starting"] = server.health
        if started is None:
            return result
        if kernel == args.record_answers and algorithm == "DDTREE" and budget is None:
            answers = stage("answers", lambda: record_answers(server.url))
            if answers is not None:
                answers["health_while_starting"] = server.health
                (run_dir / "answers.json").write_text(json.dumps(answers, indent=1))
        smoke_cmd = [OPS, "smoke", "--endpoint", server.url, "--json", run_dir / "smoke.json"]
        if kernel == "ddtree":
            smoke_cmd += ["--verify-stats", server.stats] + (["--expect-dsa"] if args.attention == "dsa" else [])
        smoke = stage("smoke", lambda: subprocess.run([str(c) for c in smoke_cmd], capture_output=True, text=True))
        if smoke is not None:
            (run_dir / "smoke.txt").write_text(smoke.stdout + smoke.stderr)
            log(f"smoke (exit {smoke.returncode}):\n{smoke.stdout[-1500:]}")
            if smoke.returncode:
                result["failed"].append("smoke: " + smoke.stdout.strip().splitlines()[-1] if smoke.stdout else "smoke")
        contexts = (args.chain_contexts or args.contexts if algorithm == "DFLASH"
                    else args.budget_contexts or args.contexts if budget is not None else args.contexts)
        bench_args = ["bench", "--endpoint", server.url, "--contexts", ",".join(map(str, contexts)), "--concurrency",
                      "1", "--rounds", "1", "--output-len", str(args.output_len), "--out", run_dir / "bench"]
        bench = stage("bench", lambda: run(bench_command(bench_args), "bench", cwd=REPO), min_left_s=60)
        if bench is not None:
            log(bench.stdout[-2500:])
        tokens = {}
        for ctx in args.same_token_contexts:
            got = stage(f"tokens {ctx}", lambda ctx=ctx: greedy_tokens(server.url, ctx, args.same_tokens))
            if got is not None:
                tokens[str(ctx)] = got
        (run_dir / "tokens.json").write_text(json.dumps(tokens))
        profiles = []
        for ctx in args.profile_contexts:
            got = stage(f"profile {ctx}", lambda ctx=ctx: profile(server.url, ctx, run_dir / f"profile-{ctx}",
                                                                  args.profile_steps), min_left_s=45)
            if got is not None:
                profiles.append(got)
        result["profiles"] = profiles
        stats = sorted(server.stats.glob("verify-*.json"))
        result["verify_stats"] = [json.loads(p.read_text()) for p in stats]
    finally:
        server.stop()
        (run_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def bench_command(bench_args: list) -> list:
    """`ddtree-ops bench` itself; for the trained pair the same client with its prompt ids replaced by the copy
    prompts (ddtree_ops.throughput.prompt_ids: the random ids it draws are not the pair's text, and most lie
    outside its byte vocabulary)."""
    if not PROMPTS["trained"]:
        return [OPS, *bench_args]
    code = ("import sys; import ddtree_ops.throughput as t; from tests.server_gpu import corpus; "
            "t.prompt_ids = lambda context, vocab, seed: corpus.serve_prompt(context); "
            "from ddtree_ops.cli import main; sys.exit(main(sys.argv[1:]))")
    return [PY, "-c", code, *bench_args]


def pack(out: Path, dest: Path, runs: list[str]) -> None:
    """Everything but the traces in one tar (the device tool returns 8 files); each trace beside it."""
    if not dest:
        return
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest / "runs.tar.gz", "w:gz") as tf:
        if (out / "summary.json").exists():
            tf.add(out / "summary.json", arcname="summary.json")
        for k in [*runs, "plain"]:
            if (out / k).exists():
                tf.add(out / k, arcname=k, filter=lambda ti: None if ti.name.endswith(".trace.json.gz") else ti)
    for k in runs:
        for trace in sorted((out / k).glob("profile-*/*.trace.json.gz")):
            ctx = trace.parent.name.split("-")[-1]
            shutil.copy(trace, dest / f"trace-{k}-{ctx}.json.gz")
    cache = GPU / "triton-cache"
    if cache.is_dir():
        with tarfile.open(dest / "triton-cache.tar.gz", "w:gz") as tf:
            tf.add(cache, arcname="triton-cache")


def plan_runs(kernels: list[str], algorithms: list[str], budgets: list[int] | None, production: int
              ) -> tuple[list[tuple], list[tuple]]:
    """(first, later) servers as (kernel, algorithm, budget; None: the production launch's). First the production
    launch and the chain (the tree against the chain; the reference and the tie check follow them), later the
    other DDTREE budgets: a call cut short keeps the comparisons that matter."""
    wanted = [None if b == production else b for b in (budgets or [production])]
    first = [(k, a, None) for a in algorithms for k in kernels if a == "DFLASH" or None in wanted]
    later = [(k, "DDTREE", b) for b in wanted if b is not None for k in kernels if "DDTREE" in algorithms]
    return first, later


def contexts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="ddtree,sglang", help="comma-separated: ddtree, sglang")
    ap.add_argument("--algorithm", default="DDTREE",
                    help="comma-separated: DDTREE (the production launch), DFLASH (the same drafter as a chain)")
    ap.add_argument("--server-args", type=shlex.split, default=[],
                    help="appended to every launch, e.g. '--cuda-graph-max-bs-decode 1' (one request at a time: "
                         "a faster start, the bs=1 graphs unchanged)")
    ap.add_argument("--budgets", type=contexts, default=None,
                    help="DDTREE node budgets to serve, e.g. 4,8,16 (default: the production launch's); a budget "
                         "other than the production one runs as <kernel>-b<budget>")
    ap.add_argument("--budget-contexts", type=contexts, default=None,
                    help="the bench contexts of the budgets other than the production one (default: --contexts)")
    ap.add_argument("--chain-contexts", type=contexts, default=None,
                    help="the DFLASH runs' bench contexts (default: --contexts)")
    ap.add_argument("--out", type=Path, default=GPU / "runs")
    ap.add_argument("--pack", type=Path, default=None, help="also pack the runs for transfer into this folder")
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting new stages after this long")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--contexts", type=contexts, default=CONTEXTS)
    ap.add_argument("--profile-contexts", type=contexts, default=PROFILE_CONTEXTS)
    ap.add_argument("--same-token-contexts", type=contexts, default=SAME_TOKEN_CONTEXTS)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--same-tokens", type=int, default=48)
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--record-answers", default="ddtree", help="the kernel whose server's answers are recorded")
    ap.add_argument("--stand-in", choices=[*sorted(STAND_INS), TRAINED], default=DEFAULT_STAND_IN,
                    help="the target stand-in (tests/server_gpu/models.py): glm5-weight is GLM-5's per-GPU work a "
                         "step; trained: the pair train_pair.py trains (make train-pair), trained first where "
                         ".gpu/models-trained lacks it, served with its copy prompts")
    ap.add_argument("--train-args", type=shlex.split, default=[],
                    help="with --stand-in trained: arguments for train_pair.py where it trains, e.g. '--seed 1'")
    ap.add_argument("--attention", choices=["dense-view", "dsa"], default="dense-view",
                    help="how the DSA stand-in is served: dense-view (production today) or dsa (its sparse attention, "
                         "patch 0007; runs named <kernel>-dsa)")
    ap.add_argument("--reference", action="store_true",
                    help="also serve the target without speculative decoding for the same-token check (run target; "
                         "with --attention dsa SGLang's own DSA serving, run sglang-dsa)")
    ap.add_argument("--no-tie-check", dest="tie_check", action="store_false",
                    help="skip the near-tie check where the two servers' greedy tokens part (a third server start)")
    args = ap.parse_args(argv)
    # The server runs in .gpu/ and is handed paths under these (stats, profiles): relative ones would land there.
    args.out = args.out.resolve()
    args.pack = args.pack.resolve() if args.pack else None
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    kernels = [k for k in args.kernel.split(",") if k]
    algorithms = [a.upper() for a in args.algorithm.split(",") if a]
    if unknown := set(algorithms) - {"DDTREE", "DFLASH"}:
        ap.error(f"--algorithm: {', '.join(sorted(unknown))} is not DDTREE or DFLASH")
    first, later = plan_runs(kernels, algorithms, args.budgets, production_budget())
    names = [run_name(k, a, args.attention, b) for k, a, b in first + later]
    summary = {"kernels": {}}
    try:
        summary["setup"] = setup()
        summary["gpu"] = gpu_description()
        log(f"setup done in {time.monotonic() - t0:.1f} s")
        PROMPTS["trained"] = args.stand_in == TRAINED
        models = make_models(args.stand_in, args.train_args)
        if args.stand_in == TRAINED:
            trained = json.loads((models["target"].parent / "train.json").read_text())
            summary["stand_in"] = {"name": TRAINED, "layers": trained["sizes"]["layers"],
                                   "mlp_width": trained["sizes"]["mlp"], "training": trained}
        else:
            summary["stand_in"] = {"name": args.stand_in, "layers": STAND_INS[args.stand_in].layers,
                                   "mlp_width": STAND_INS[args.stand_in].mlp_width}
        log(f"models done at {time.monotonic() - t0:.1f} s")
        reference = reference_run_name(args.attention)

        def serve(runs: list[tuple]) -> None:
            for kernel, algorithm, budget in runs:
                name = run_name(kernel, algorithm, args.attention, budget)
                summary["kernels"][name] = run_kernel(kernel, models, args.out, deadline, args, algorithm, budget)
                if args.pack:  # after each run: a call cut short still returns what ran
                    pack(args.out, args.pack, names)

        serve(first)
        if args.reference:  # between the two: the target without speculation, the tokens the runs are held to
            summary["kernels"][reference] = reference_tokens(models, args.out, deadline, args)
            names.append(reference)
            if args.pack:
                pack(args.out, args.pack, names)
        serve(later)
        ties = summary["kernels"].get(reference, {}).get("ties")  # the reference answered them
        if ties is not None:
            summary["ties"] = ties
        elif args.tie_check and time.monotonic() < deadline - 120:
            summary["ties"] = tie_check(models, args.out, deadline, args.attention)
    except Exception as exc:
        summary["error"] = f"{type(exc).__name__}: {exc}"
        log(f"FAILED: {exc}\n{traceback.format_exc()[-3000:]}")
    finally:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        if args.pack:
            pack(args.out, args.pack, names)
    failed = bool(summary.get("error")) or any(r.get("failed") for r in summary["kernels"].values())
    for kernel, r in summary["kernels"].items():
        log(f"{kernel}: start {r.get('start_s')} s, stages {r.get('stages')}, failed {r.get('failed')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
