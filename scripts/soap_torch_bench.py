#!/usr/bin/python3
"""SOAP-family step time in PyTorch, for a side-by-side ratio with apps/bench_optim.

A PyTorch rendering of docs/specs/soap_family.md section 1.2 (current main: factors with the
current gradient, eigenbasis refresh every step by eigh or one QR power step with the post-sort,
M rotated out and in, V not rotated, decoupled decay, Adam in eigen coordinates) and section 2
(REKLS: KL-Shampoo factors, eigh every step). It is written from the spec, not copied from the
reference. It steps the 16 hidden matrices of the default CPU model (4 layers, D 128: qkv
[3D, D], proj [D, D], fc [4D, D], proj [D, 4D]) and prints the median step time in ms (wall and
process CPU time), one JSON object per variant:

    /usr/bin/python3 scripts/soap_torch_bench.py --threads 2 --repeat 5
"""
import argparse
import json
import time

import torch


def eigh_desc(k):
    lam, q = torch.linalg.eigh(k)
    return lam.flip(-1), q.flip(-1)


class Soap:
    def __init__(self, shapes, use_eigh, kl, lr=3e-3, betas=(0.9, 0.95), shampoo_beta=0.95,
                 eps=1e-8, wd=0.01):
        self.use_eigh, self.kl = use_eigh, kl
        self.lr, self.b1, self.b2, self.sb, self.eps, self.wd = lr, *betas, shampoo_beta, eps, wd
        self.state = []
        for m, n in shapes:
            self.state.append(dict(t=0, M=torch.zeros(m, n), V=torch.zeros(m, n),
                                   L=torch.zeros(m, m), R=torch.zeros(n, n),
                                   QL=torch.eye(m), QR=torch.eye(n),
                                   lamL=torch.zeros(m), lamR=torch.zeros(n)))

    def kl_weights(self, q, lam, dim):
        w = lam.clamp(min=self.eps).pow(-1) / dim
        return (q * w[None, :]) @ q.T

    def refresh(self, k, q):
        q = torch.linalg.qr(k @ q).Q
        lam = torch.diag(q.T @ k @ q)
        idx = torch.argsort(lam, descending=True)
        return lam[idx], q[:, idx]

    @torch.no_grad()
    def step(self, params, grads):
        for p, g, s in zip(params, grads, self.state):
            k = s["t"] + 1
            bs = 1 - (1 - self.sb) / (1 - self.sb ** k)
            m, n = p.shape
            if self.kl:
                cl = self.kl_weights(s["QL"], s["lamL"], m)
                cr = self.kl_weights(s["QR"], s["lamR"], n)
                ul, ur = (g @ cr) @ g.T, (g.T @ cl) @ g
            else:
                ul, ur = g @ g.T, g.T @ g
            s["L"].lerp_(ul, 1 - bs)
            s["R"].lerp_(ur, 1 - bs)
            s["M"] = s["QL"] @ s["M"] @ s["QR"].T
            if self.use_eigh or s["t"] == 0:
                s["lamL"], s["QL"] = eigh_desc(s["L"])
                s["lamR"], s["QR"] = eigh_desc(s["R"])
            else:
                s["lamL"], s["QL"] = self.refresh(s["L"], s["QL"])
                s["lamR"], s["QR"] = self.refresh(s["R"], s["QR"])
            s["M"] = s["QL"].T @ s["M"] @ s["QR"]
            p.add_(p, alpha=-self.wd * self.lr)
            gp = s["QL"].T @ g @ s["QR"]
            s["M"].lerp_(gp, 1 - self.b1)
            s["V"].lerp_(gp * gp, 1 - self.b2)
            c1, c2 = 1 - self.b1 ** k, 1 - self.b2 ** k
            u = (s["M"] / c1) / ((s["V"] / c2).sqrt() + self.eps)
            p.add_(s["QL"] @ u @ s["QR"].T, alpha=-self.lr)
            s["t"] += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d = a.d_model
    shapes = [s for _ in range(a.layers) for s in [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)]]
    gen = torch.Generator().manual_seed(0)
    for name, use_eigh, kl in [("soap qr", False, False), ("soap eigh", True, False),
                               ("rekls", True, True)]:
        params = [0.02 * torch.randn(s, generator=gen) for s in shapes]
        grads = [1e-3 * torch.randn(s, generator=gen) for s in shapes]
        opt = Soap(shapes, use_eigh, kl)
        for _ in range(a.warmup):
            opt.step(params, grads)
        wall, cpu = [], []
        for _ in range(a.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            opt.step(params, grads)
            wall.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
        wall.sort()
        cpu.sort()
        print(json.dumps({"impl": "torch", "torch": torch.__version__, "threads": a.threads,
                          "what": name, "ms": round(wall[len(wall) // 2], 3),
                          "cpu_ms": round(cpu[len(cpu) // 2], 3)}), flush=True)


if __name__ == "__main__":
    main()
