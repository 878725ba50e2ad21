#!/usr/bin/python3
"""The reference side of tools/bench_soap.sh: NVIDIA-NeMo/Emerging-Optimizers' own SOAP and REKLS
(emerging_optimizers.legacy_soap) timed as apps/bench_optim times the engine's, one JSON row per
optimizer in bench_optim's format ("impl": "reference").

    soap_torch_bench.py [--emopt-dir DIR] [--threads 1] [--device cpu|cuda] [--d-model 128]
                        [--layers 4] [--repeat 5] [--warmup 2] [--check]

DIR (default: $EMOPT_DIR) is a checkout of https://github.com/NVIDIA-NeMo/Emerging-Optimizers, the
folder holding emerging_optimizers/. It is a yardstick kept outside this repository; the script
says how to get it when it is missing (exit status 2).

Same work as bench_optim's step rows: the hidden matrices [3D, D], [D, D], [4D, D], [D, 4D] of every
layer (D 128 and 4 layers: cpu_small; D 768 and 12 layers: GPT-2 124M), parameters N(0, 0.02),
fresh N(0, 1) gradients every step drawn before the clock starts, SOAP with QR power iteration,
SOAP with eigh and REKLS at their defaults with lr 1e-3. Each row is the median over --repeat
steps after --warmup untimed ones (the first step is always an eigh): wall ms and process CPU ms.
Runs on PyTorch 1.13 (Debian's python3-torch) through small shims for what the package imports
from newer Python and PyTorch, and on PyTorch 2.x as is.
"""
import argparse
import json
import os
import sys
import time
import types
import typing
from typing import Any

GET_IT = """the reference implementation (NVIDIA-NeMo/Emerging-Optimizers) is not at {where}.
Get it outside this repository and point the benchmark at it:
    git clone https://github.com/NVIDIA-NeMo/Emerging-Optimizers ~/emerging-optimizers
    EMOPT_DIR=~/emerging-optimizers tools/bench_soap.sh      (or --emopt-dir ~/emerging-optimizers)"""


def reference_dir(arg):
    where = arg or os.environ.get("EMOPT_DIR", "")
    if not where or not os.path.isfile(os.path.join(where, "emerging_optimizers", "legacy_soap",
                                                    "soap.py")):
        print("soap_torch_bench: " + GET_IT.format(
            where=repr(where) if where else "--emopt-dir / $EMOPT_DIR (unset)"), file=sys.stderr)
        sys.exit(2)
    return where


def import_reference(path):
    """SOAP and REKLS from the checkout at `path`, with shims for older Python and PyTorch."""
    import torch
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    try:
        import absl.logging  # noqa: F401
    except ImportError:
        absl = types.ModuleType("absl")
        log = types.ModuleType("absl.logging")
        for name in ("debug", "info", "warning", "error", "vlog", "log"):
            setattr(log, name, lambda *a, **k: None)
        absl.logging = log
        sys.modules["absl"] = absl
        sys.modules["absl.logging"] = log
    if not hasattr(torch, "compile"):
        torch.compile = lambda f=None, **k: f if f is not None else (lambda g: g)
    import torch.optim.optimizer as torch_optimizer
    if not hasattr(torch_optimizer, "ParamsT"):
        torch_optimizer.ParamsT = Any
    sys.path.insert(0, path)
    # The package's registry decorates every optimizer module; a stand-in keeps the import light.
    registry = types.ModuleType("emerging_optimizers.registry")
    registry.register_optimizer = lambda name: (lambda cls: cls)
    import emerging_optimizers
    sys.modules["emerging_optimizers.registry"] = registry
    emerging_optimizers.registry = registry
    from emerging_optimizers.legacy_soap import REKLS, SOAP
    return SOAP, REKLS


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emopt-dir", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5, choices=range(1, 1000), metavar="N")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--check", action="store_true",
                    help="only check that the reference checkout is there")
    a = ap.parse_args()
    path = reference_dir(a.emopt_dir)
    if a.check:
        return
    import torch
    soap, rekls = import_reference(path)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    d = a.d_model
    shapes = [s for _ in range(a.layers) for s in [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)]]
    model = {(128, 4): "cpu_small", (768, 12): "gpt2_124m"}.get((d, a.layers),
                                                                 "D%dxL%d" % (d, a.layers))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for what, cls, kw in [("soap qr", soap, {}), ("soap eigh", soap, {"use_eigh": True}),
                          ("rekls", rekls, {})]:
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(*s, device=dev) * 0.02) for s in shapes]
        opt = cls(params, lr=1e-3, **kw)
        wall, cpu = [], []
        for step in range(a.warmup + a.repeat):
            for p in params:
                p.grad = torch.randn_like(p)
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            opt.step()
            sync()
            if step >= a.warmup:
                wall.append(1e3 * (time.perf_counter() - t0))
                cpu.append(1e3 * (time.process_time() - c0))
        print(json.dumps({"impl": "reference", "device": a.device, "np": 1,
                          "threads": torch.get_num_threads(), "part": "step", "what": what,
                          "model": model, "ms": round(sorted(wall)[len(wall) // 2], 3),
                          "cpu_ms": round(sorted(cpu)[len(cpu) // 2], 3),
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
