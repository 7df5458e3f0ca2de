"""What the real-server GPU run needs that the GPU machine lacks, packed on this machine into `.gpu/`.

The GPU machine has torch, Triton and CUDA but no package index and no SGLang. This builds, here:
- the release bundle exactly as `ddtree-ops bundle` builds it for a host (our two wheels and SGLang
  built from the pinned DDTree commit: the ddtree-v2 snapshot made a git repository, as the deploy
  tests install it), without dependencies;
- the dependencies the GPU image lacks (`h200-wheels.txt`: exact pins for its Python 3.12), with two
  wheels cut to what the Triton backend loads (sglang-kernel without FA3's 1.1 GB `flash_ops` and the
  sm_100 and InfLLM builds; xgrammar without its static C++ library);
- the production launch (`playbooks/server-args.yml` over inventory/production): the launch.json
  (module and argument vector) and env file the role renders for the host `ct200`.
Every wheel is re-zipped uncompressed and the set packed as one xz tar (the device tool carries
64 MiB a call). `python -m tests.server_gpu.carry` (or `make gpu-carry`) writes `.gpu/`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CARRY = REPO / ".gpu"
PINS = Path(__file__).with_name("h200-wheels.txt")
# Wheel members the Triton-backend server never loads (prefix of the path inside the wheel).
CUT = {
    "sglang_kernel": ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/", "sgl_kernel/infllm_ops"),
    "xgrammar": ("xgrammar/lib/libxgrammar.a",),
}
GPU_PYTHON = "3.12"
GPU_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
                 "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"]
LIMIT = 60 * 2**20  # the device tool's 64 MiB a call, less the repository itself


def _run(cmd: list[str], what: str, **kwargs) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode:
        raise SystemExit(f"{what} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-1200:]}")
    return proc.stdout


def build_sglang_bundle(work: Path) -> dict:
    """The deploy's bundle for the pinned DDTree commit (from its snapshot), without dependencies."""
    from ddtree_ops.bundle import BundleSpec, build_bundle
    from ddtree_ops.ddtree_sources import git_checkout, load_sources

    source = next(s for s in load_sources() if s.name == "ddtree-v2")
    snapshot = source.snapshot_path()
    if snapshot is None:
        raise SystemExit(f"{source.snapshot} not found: set DDTREE_SGLANG_SNAPSHOTS to the folder holding it")
    repo = work / "ddtree-v2"
    commit = git_checkout(snapshot, repo)
    spec = BundleSpec(sglang_git_url=f"file://{repo}", sglang_git_commit=commit, with_dependencies=False,
                      python_version=GPU_PYTHON, platforms=GPU_PLATFORMS[:1])
    bundle = build_bundle(spec, work / "bundles", log=lambda m: print(m, file=sys.stderr))
    return {"bundle": bundle, "source": source.name, "snapshot_commit": source.commit}


def download_dependencies(dest: Path) -> None:
    pins = [line.split("#")[0].strip() for line in PINS.read_text().splitlines()]
    platform_flags = [flag for p in GPU_PLATFORMS for flag in ("--platform", p)]
    env = {**os.environ, "PIP_CONSTRAINT": ""}  # this machine's pip cap is for its own torch, not the GPU's
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
          "--python-version", GPU_PYTHON, "--implementation", "cp", *platform_flags, "-d", str(dest),
          *[p for p in pins if p]], "downloading the GPU machine's dependencies", env=env)


def stored_copy(wheel: Path, dest: Path) -> Path:
    """`wheel` re-zipped without compression (xz packs it far better), less its CUT members."""
    cut = CUT.get(wheel.name.split("-")[0], ())
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if info.filename.startswith(cut):
                continue
            data = zin.read(info.filename)
            if cut and info.filename.endswith(".dist-info/RECORD"):
                kept = [r for r in data.decode().splitlines() if not r.split(",")[0].startswith(cut)]
                data = ("\n".join(kept) + "\n").encode()
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)
    return out


def render_launch(dest: Path, host: str = "ct200") -> None:
    """The production inventory's launch for `host`, rendered by the role (playbooks/server-args.yml)."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    _run([str(bin_dir / "ansible-playbook"), "-i", "inventory/production/hosts.yml", "playbooks/server-args.yml",
          "--limit", host, "-e", f"ddtree_render_dir={dest}"], "rendering the production launch", cwd=REPO, env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=CARRY)
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-carry-") as tmp:
        tmp = Path(tmp)
        built = build_sglang_bundle(Path(os.environ.get("DDTREE_CARRY_WORK", tmp)))
        bundle = built["bundle"]
        wheels = tmp / "wheels"
        wheels.mkdir()
        with tarfile.open(bundle.tar) as tf:
            tf.extractall(tmp / "bundle", filter="data")
        for whl in (tmp / "bundle" / "wheels").glob("*.whl"):
            if whl.name.startswith(("sglang-", "ddtree_kernels-", "ddtree_ops-")):
                shutil.copy(whl, wheels)
        download_dependencies(wheels)
        stored = tmp / "stored"
        stored.mkdir()
        names = sorted(stored_copy(w, stored).name for w in sorted(wheels.glob("*.whl")))
        tar_path = out / "wheels.tar.xz"
        with tarfile.open(tar_path, "w:xz", preset=6) as tf:
            for name in names:
                tf.add(stored / name, arcname=name)
        shutil.copytree(tmp / "bundle" / "patches", out / "patches", dirs_exist_ok=True)
        render_launch(out / "launch")
        manifest = {"bundle_id": bundle.id, "sglang_version": bundle.sglang_version, "source": built["source"],
                    "source_commit": built["snapshot_commit"], "versions": bundle.versions, "wheels": names,
                    "cut": {k: list(v) for k, v in CUT.items()}}
        (out / "carry.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and "triton-cache" not in p.name)
    print(f"{out}: {len(names)} wheels, {size / 2**20:.1f} MiB (the device tool carries 64 MiB a call)")
    if size > LIMIT:
        print(f"warning: {size / 2**20:.1f} MiB is over {LIMIT / 2**20:.0f} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
