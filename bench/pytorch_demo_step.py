#!/usr/bin/env python3
"""DeMo's step as the reference implementation computes it, timed on the CPU: the peer of
`tandem bench demo` in bench/demo_vs_pytorch.sh (issue 30, item 3).

The reference is bloc97/DeMo's demo.py (arXiv 2411.19870; ../shared/BRIEF.md section 1.3).
This script performs its per-tensor torch operations, in its order, on one rank:

    p.mul_(1 - lr*wd); delta.mul_(beta); delta.add_(grad, alpha=lr)
    encode: blocks by reshape, then einsum with the DCT basis on both block axes
    compress: torch.topk(|Z|, k, sorted=False) over each block's coefficients, gather
    error feedback: zeros + scatter_reduce(mean), einsum with the inverse basis, delta.sub_
    all-gather: on one rank, the reference's receive lists (zeros_like) take the rank's
            own message, and the decode decompresses their concatenation
    decode: zeros + scatter_reduce(mean), einsum with the inverse basis
    grad.copy_(u), grad.sign_(), then SGD's step p.add_(grad, alpha=-lr)

It is not the reference's code (which needs torch.distributed and einops): the same
operations, written from the algorithm, on the tensors `tandem bench demo` uses (one GPT-2
small layer: c_attn, attn c_proj, c_fc, mlp c_proj and their biases; 7,084,800
parameters), fp32. Prints one JSON line: seconds per step (the best of --steps after --warmup,
as `tandem bench demo` reports its best pass) and parameters per second.

    python3 bench/pytorch_demo_step.py [--threads N] [--warmup 2] [--steps 5]
"""

import argparse
import json
import math
import sys
import time

torch = None  # main() imports it, once the arguments are checked


# (shape) of the tensors of one GPT-2 small layer, as tandem bench demo lists them.
GPT2_SMALL_LAYER = [
    (2304, 768), (2304,),  # attn c_attn weight, bias
    (768, 768), (768,),    # attn c_proj
    (3072, 768), (3072,),  # mlp c_fc
    (768, 3072), (768,),   # mlp c_proj
]


def chunk_for(n, target):
    """The largest divisor of n that is <= target (n itself when n <= target)."""
    if n <= target:
        return n
    return max(d for d in range(1, target + 1) if n % d == 0)


def dct_basis(n):
    """f[j, k] = C[k, j], C the orthonormal DCT-II: x @ f is the DCT of x's rows."""
    j = torch.arange(n, dtype=torch.float64)
    k = j[:, None]
    c = torch.cos(math.pi * (2 * j[None, :] + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    c[0] /= math.sqrt(2.0)
    return c.T.contiguous().float()


class Tensor:
    def __init__(self, shape, chunk, topk, generator):
        self.p = torch.randn(shape, generator=generator) * 0.02
        self.gradient = torch.randn(shape, generator=generator) * 0.01  # the same every step
        self.grad = torch.empty(shape)  # p.grad, which the reference overwrites with u
        self.delta = torch.zeros(shape)
        self.blocks = [chunk_for(n, chunk) for n in shape]
        self.forward = [dct_basis(c) for c in self.blocks]
        self.inverse = [f.T.contiguous() for f in self.forward]  # orthonormal: inverse = transpose
        per_block = math.prod(self.blocks)
        self.topk = max(1, min(topk, per_block))

    def encode(self, x):
        if x.dim() == 2:
            (m, n), (cm, cn) = x.shape, self.blocks
            x = x.reshape(m // cm, cm, n // cn, cn)
            return torch.einsum("ijkl,jb,ld->ikbd", x, self.forward[0], self.forward[1])
        x = x.reshape(-1, self.blocks[0])
        return torch.einsum("ij,jb->ib", x, self.forward[0])

    def decode(self, z):
        if z.dim() == 4:
            y = torch.einsum("ijkl,kb,ld->ibjd", z, self.inverse[0], self.inverse[1])
            return y.reshape(self.p.shape)
        return torch.einsum("ij,jb->ib", z, self.inverse[0]).reshape(self.p.shape)

    def compress(self, z):
        flat = z.reshape(*z.shape[:-2], -1) if z.dim() == 4 else z
        idx = torch.topk(flat.abs(), k=self.topk, dim=-1, largest=True, sorted=False).indices
        return idx, torch.gather(flat, -1, idx), z.shape

    @staticmethod
    def decompress(idx, val, shape):
        x = torch.zeros(shape)
        flat = x.reshape(*shape[:-2], -1) if len(shape) == 4 else x
        flat.scatter_reduce_(-1, idx, val, reduce="mean", include_self=False)
        return flat.reshape(shape)

    def step(self, lr, beta, wd):
        if wd != 0.0:
            self.p.mul_(1.0 - lr * wd)
        self.delta.mul_(beta)
        self.delta.add_(self.gradient, alpha=lr)
        idx, val, shape = self.compress(self.encode(self.delta))
        self.delta.sub_(self.decode(self.decompress(idx, val, shape)))
        # The all-gather on one rank: the reference's receive lists (zeros_like), filled with
        # this rank's own message, concatenated, decoded once more.
        idx_list, val_list = [torch.zeros_like(idx)], [torch.zeros_like(val)]
        idx_list[0].copy_(idx)
        val_list[0].copy_(val)
        u = self.decode(self.decompress(torch.cat(idx_list, -1), torch.cat(val_list, -1), shape))
        # The reference sets the gradient to u, takes its sign in place, and leaves the step
        # to torch.optim.SGD (foreach=False: one add per tensor).
        self.grad.copy_(u)
        self.grad.sign_()
        self.p.add_(self.grad, alpha=-lr)


def main():
    global torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--topk", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=64)
    args = parser.parse_args()
    if args.threads < 0 or args.warmup < 0 or args.steps < 1:
        parser.error("--threads >= 0, --warmup >= 0 and --steps >= 1")
    if args.topk < 1 or args.chunk < 1:
        parser.error("--topk and --chunk must be at least 1")
    try:
        import torch
    except ImportError:
        sys.exit("pytorch_demo_step.py: needs torch (pip install torch)")
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    tensors = [Tensor(s, args.chunk, args.topk, generator) for s in GPT2_SMALL_LAYER]
    params = sum(t.p.numel() for t in tensors)
    times = []
    with torch.no_grad():
        for i in range(args.warmup + args.steps):
            begin = time.perf_counter()
            for t in tensors:
                t.step(lr=1e-3, beta=0.999, wd=0.0)
            if i >= args.warmup:
                times.append(time.perf_counter() - begin)
    seconds = min(times)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "parameters": params, "seconds_per_step": seconds,
                      "params_per_s": params / seconds}))


if __name__ == "__main__":
    main()
