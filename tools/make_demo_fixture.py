#!/usr/bin/env python3
"""Generate tests/fixtures/demo_reference.safetensors: an independent reference for DeMo.

DeMo (Peng, Quesnelle, Kingma; arXiv 2411.19870) written from ../shared/BRIEF.md section 1.3
with numpy only, for tandem's DeMo rule to be checked against (issue 11). Nothing here is
shared with the C++ code: the DCT matrices are built from their definition, the block
tiling from the chunk rule, top-k by a stable sort.

Per tensor, in order, on each of R simulated ranks, at step t with learning rate lr:

    p     *= 1 - lr*wd                  decoupled weight decay: the factor in float64,
                                        rounded to float32 once (the reference's
                                        p.mul_(1 - lr * wd) with Python floats)
    delta  = beta*delta + lr*grad       lr inside the momentum, the rank's own gradient
    Z      = DCT(delta) per block       orthonormal DCT-II, separable on 2-D blocks
    S      = top-k of |Z| per block     ties to the lower coefficient index
    delta -= IDCT(Z restricted to S)    error feedback
    Q[i]   = sum of the values sent for coefficient i (ranks in order) / ranks that sent i
    u      = IDCT(Q)
    p     -= lr * sign(u)               sign(0) = 0

Precision: parameters, momentum and the sent values are float32 as tandem keeps them.
Every operation on p is one float32 operation (numpy float32 arithmetic), as tandem's, so
p matches exactly wherever u is not within rounding of 0. The momentum update
beta*delta + lr*grad is rounded twice here (product, then sum); the DCT, the error feedback
and the decode are computed in float64 and rounded to float32 once. tandem's fixed-order
float32 dot products therefore differ from these by a few ulps: the test states its
tolerances.

Stored (all little-endian; F32 unless noted), for each tensor name N of shape s:
    N.p0                   s        initial parameters (the same on every rank)
    N.grad.r{r}.t{t}       s        rank r's gradient at step t
    N.p.t{t}               s        parameters after step t (the same on every rank)
    N.delta.r{r}.t{t}      s        rank r's momentum after step t
    N.index.r{r}.t{t}      [b, k]   I32: coefficients rank r sent, per block, in the
                                    order of decreasing |Z| (ties: lower index first)
    N.value.r{r}.t{t}      [b, k]   their values (signed)
    N.u.t{t}               s        the decoded update u (float64 rounded to float32)
Blocks are numbered row-major over the tensor's grid of blocks; coefficient index
f_row * c_n + f_col within a 2-D block, f within a 1-D one. Hyper-parameters are strings
in "__metadata__".

With --clamped, the tensors are those whose DCT block is smaller than TOPK (a bias of 7, a
prime length above the chunk, whose blocks are of 1, a 5 x 6 matrix) beside one that is not
(64 x 64): each sends min(TOPK, its block) coefficients per block, as the reference clamps
topk per tensor (bloc97/DeMo demo.py, CompressDCT._clamp_topk, lines 266-271, called by
CompressDCT.compress at 279-281: topk = x.shape[-1], the block's coefficients, when larger).
Its "compression_topk" stays TOPK; the index and value arrays are [b, min(TOPK, block)].

Usage: python3 tools/make_demo_fixture.py [--out tests/fixtures/demo_reference.safetensors]
       python3 tools/make_demo_fixture.py --clamped \
           --out tests/fixtures/demo_reference_clamped.safetensors
"""

import argparse
import json
import math
import struct
import sys

import numpy as np

RANKS = 3
STEPS = 3
BETA = 0.999
TOPK = 32
CHUNK = 64
WEIGHT_DECAY = 0.1
# A changing learning rate, one per step. 0.0485 and 0.0406 are learning rates whose decay
# factor 1 - lr*wd rounds to another float32 when computed in float32 (tandem before issue
# 26 item 12): the fixture tells the two apart.
LRS = [0.0485, 0.0406, 0.01]
SEED = 2411
# Shapes: chunks that are not 64 (96 -> 48, 80 -> 40), several 64 x 64 blocks, a prime
# length below the chunk (one block of 37), and a 1-D tensor cut into two chunks of 50.
TENSORS = [
    ("w_96x80", (96, 80)),
    ("w_128x64", (128, 64)),
    ("bias_37", (37,)),
    ("bias_100", (100,)),
]
# --clamped: blocks of 7, 1 (67 is a prime above the chunk) and 30 coefficients, below TOPK,
# and one of 64 x 64 above it.
CLAMPED_TENSORS = [
    ("bias_7", (7,)),
    ("bias_67", (67,)),
    ("w_5x6", (5, 6)),
    ("w_64x64", (64, 64)),
]


def chunk_of(n, chunk):
    """The largest divisor of n that is at most chunk (n itself when n <= chunk)."""
    if n <= chunk:
        return n
    for c in range(chunk, 0, -1):
        if n % c == 0:
            return c
    raise AssertionError("unreachable")


def dct_matrix(n):
    """Orthonormal DCT-II: C[k, j] = s_k cos(pi (2j + 1) k / 2n)."""
    c = np.empty((n, n), dtype=np.float64)
    for k in range(n):
        s = math.sqrt(1.0 / n) if k == 0 else math.sqrt(2.0 / n)
        for j in range(n):
            c[k, j] = s * math.cos(math.pi * (2 * j + 1) * k / (2 * n))
    return c


class Blocks:
    """The tiling of a 1-D or 2-D tensor into DCT blocks, and the transforms."""

    def __init__(self, shape, chunk):
        self.shape = shape
        if len(shape) == 1:
            self.cm, self.cn = 1, chunk_of(shape[0], chunk)
            self.rows, self.cols = 1, shape[0]
        elif len(shape) == 2:
            self.cm, self.cn = chunk_of(shape[0], chunk), chunk_of(shape[1], chunk)
            self.rows, self.cols = shape
        else:
            raise ValueError("DeMo supports 1-D and 2-D tensors only")
        self.Cm, self.Cn = dct_matrix(self.cm), dct_matrix(self.cn)
        self.grid = (self.rows // self.cm, self.cols // self.cn)
        self.count = self.grid[0] * self.grid[1]
        self.size = self.cm * self.cn

    def to_blocks(self, x):
        """[count, cm, cn] (row-major over the grid) from a tensor."""
        x2 = np.asarray(x, dtype=np.float64).reshape(self.rows, self.cols)
        gm, gn = self.grid
        return x2.reshape(gm, self.cm, gn, self.cn).transpose(0, 2, 1, 3).reshape(
            self.count, self.cm, self.cn)

    def from_blocks(self, b):
        gm, gn = self.grid
        x2 = b.reshape(gm, gn, self.cm, self.cn).transpose(0, 2, 1, 3).reshape(
            self.rows, self.cols)
        return x2.reshape(self.shape)

    def dct(self, x):
        """Coefficients [count, cm * cn] of a tensor (float64)."""
        b = self.to_blocks(x)
        z = np.einsum("ka,nab,lb->nkl", self.Cm, b, self.Cn)  # Cm @ block @ Cn^T
        return z.reshape(self.count, self.size)

    def idct(self, z):
        """The tensor (float64) whose block coefficients are z [count, cm * cn]."""
        zb = z.reshape(self.count, self.cm, self.cn)
        b = np.einsum("ka,nkl,lb->nab", self.Cm, zb, self.Cn)  # Cm^T @ Z @ Cn
        return self.from_blocks(b)


def clamped_topk(topk, blocks):
    """The reference's CompressDCT._clamp_topk: at most the block's coefficients."""
    return min(topk, blocks.size)


def top_k(z, k):
    """Per block: the k indices of largest |z|, decreasing, ties to the lower index."""
    order = np.argsort(-np.abs(z), axis=1, kind="stable")
    return order[:, :k].astype(np.int32)


def demo_step(p, deltas, grads, blocks, lr, out, name, t):
    """One DeMo step of one tensor on every rank; p is shared, deltas per rank (float32)."""
    f32 = np.float32
    lr32, beta32 = f32(lr), f32(BETA)
    decay = f32(1.0 - lr * WEIGHT_DECAY)  # Python floats: one rounding, to float32
    assert lr not in (0.0485, 0.0406) or decay != f32(f32(1.0) - lr32 * f32(WEIGHT_DECAY))
    p = p * decay  # float32
    sent = []
    for r in range(RANKS):
        d = beta32 * deltas[r] + lr32 * grads[r]  # float32: product, product, sum
        z = blocks.dct(d)
        idx = top_k(z, clamped_topk(TOPK, blocks))
        vals = np.take_along_axis(z, idx, axis=1)
        kept = np.zeros_like(z)
        np.put_along_axis(kept, idx, vals, axis=1)
        deltas[r] = (d.astype(np.float64) - blocks.idct(kept)).astype(f32)
        vals32 = vals.astype(f32)
        sent.append((idx, vals32))
        out[f"{name}.index.r{r}.t{t}"] = idx
        out[f"{name}.value.r{r}.t{t}"] = vals32
    # Decode: the mean over the ranks that sent each coefficient, ranks summed in order.
    total = np.zeros((blocks.count, blocks.size), dtype=np.float64)
    senders = np.zeros((blocks.count, blocks.size), dtype=np.int64)
    for idx, vals in sent:
        rows = np.arange(blocks.count)[:, None]
        total[rows, idx] += vals.astype(np.float64)
        senders[rows, idx] += 1
    q = np.where(senders > 0, total / np.maximum(senders, 1), 0.0)
    u = blocks.idct(q)
    p = p - lr32 * np.sign(u).astype(f32)
    out[f"{name}.u.t{t}"] = u.astype(f32)
    out[f"{name}.p.t{t}"] = p
    for r in range(RANKS):
        out[f"{name}.delta.r{r}.t{t}"] = deltas[r]
    return p


def write_safetensors(path, tensors, metadata):
    """tensors: dict name -> numpy array (F32 or I32), written in insertion order."""
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, array in tensors.items():
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[array.dtype]
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for data in blobs:
            f.write(data)


def self_check():
    """The brief's chunk examples, an orthonormal DCT, and a transform that inverts."""
    for n, c in [(64, 64), (50304, 64), (50280, 60), (96, 48), (80, 40), (100, 50), (37, 37),
                 (67, 1)]:
        assert chunk_of(n, 64) == c, (n, chunk_of(n, 64), c)
    for n in (1, 5, 48, 64):
        c = dct_matrix(n)
        assert np.allclose(c @ c.T, np.eye(n), atol=1e-12), n
    rng = np.random.default_rng(0)
    for shape in [(96, 80), (37,), (100,)]:
        b = Blocks(shape, CHUNK)
        x = rng.normal(size=shape)
        assert np.allclose(b.idct(b.dct(x)), x, atol=1e-12), shape
    # The 2-D block transform is C_m X C_n^T on one block.
    b = Blocks((48, 40), CHUNK)
    x = rng.normal(size=(48, 40))
    assert np.allclose(b.dct(x).reshape(48, 40), b.Cm @ x @ b.Cn.T, atol=1e-12)
    # Ties go to the lower index.
    assert top_k(np.array([[1.0, -3.0, 3.0, 2.0]]), 2).tolist() == [[1, 2]]
    # The clamp: a block of 7 sends 7, of 1 sends 1, of 4096 sends TOPK.
    assert [clamped_topk(TOPK, Blocks(s, CHUNK)) for s in [(7,), (67,), (5, 6), (64, 64)]] == [
        7, 1, 30, TOPK]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/demo_reference.safetensors")
    parser.add_argument("--clamped", action="store_true",
                        help="tensors whose blocks are smaller than the top-k (see above)")
    args = parser.parse_args()
    self_check()
    tensors = CLAMPED_TENSORS if args.clamped else TENSORS
    rng = np.random.default_rng(SEED)
    out = {}
    for name, shape in tensors:
        blocks = Blocks(shape, CHUNK)
        assert args.clamped or TOPK <= blocks.size, f"{name}: topk {TOPK} > block of {blocks.size}"
        p = rng.normal(0.0, 0.5, size=shape).astype(np.float32)
        out[f"{name}.p0"] = p.copy()
        deltas = [np.zeros(shape, dtype=np.float32) for _ in range(RANKS)]
        for t in range(STEPS):
            grads = []
            for r in range(RANKS):
                g = rng.normal(0.0, 1.0, size=shape).astype(np.float32)
                out[f"{name}.grad.r{r}.t{t}"] = g
                grads.append(g)
            p = demo_step(p, deltas, grads, blocks, LRS[t], out, name, t)
    metadata = {
        "generator": "tools/make_demo_fixture.py",
        "numpy_version": np.__version__,
        "ranks": str(RANKS), "steps": str(STEPS), "lrs": ",".join(str(x) for x in LRS),
        "compression_decay": str(BETA), "compression_topk": str(TOPK),
        "compression_chunk": str(CHUNK), "weight_decay": str(WEIGHT_DECAY),
        "seed": str(SEED),
        "tensors": ",".join(f"{n}:{'x'.join(str(d) for d in s)}" for n, s in tensors),
    }
    write_safetensors(args.out, out, metadata)
    print(f"wrote {args.out}: {len(out)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
