"""The PyTorch peer of `tandem bench checkpoint-io`: the same arrays (the model's tensors and,
per tensor, the optimizer's state arrays: AdamW's exp_avg and exp_avg_sq, as
torch.optim.AdamW's state_dict holds them), saved the way a PyTorch training loop saves a
checkpoint (torch.save of {"model", "optimizer"} to one file, then flush and fsync, so that
it is on disk as tandem's is) and read back with torch.load, --rounds times in alternation, in
the directory tandem wrote to. The shapes come from tandem's JSON (--shapes), so both sides
write the same tensors. Prints one JSON line: bytes, each round's milliseconds, the medians.

  python3 bench/pytorch_checkpoint_io.py --shapes tandem.json --dir DIR [--rounds 5]
"""
import argparse
import json
import os
import statistics
import sys
import time


def fail(message):
    print(f"pytorch_checkpoint_io.py: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", required=True,
                        help="the JSON of `tandem bench checkpoint-io --json` (its tensors)")
    parser.add_argument("--dir", required=True, help="where to write (the disk tandem used)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.rounds <= 0:
        fail(f"--rounds {args.rounds} is not positive; pass 1 or more")
    if not os.path.isdir(args.dir):
        fail(f"--dir {args.dir} is not a directory; name the directory tandem wrote to")
    try:
        spec = json.loads(open(args.shapes).read().strip().splitlines()[-1])
        tensors, arrays = spec["tensors"], spec["optimizer_arrays"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        fail(f"--shapes {args.shapes}: not the JSON of `tandem bench checkpoint-io --json` ({e})")
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is not installed ({e}); pip install torch")
    if args.threads:
        torch.set_num_threads(args.threads)

    generator = torch.Generator().manual_seed(1337)
    model = {name: 0.02 * torch.randn(shape, generator=generator) for name, shape in tensors}
    state = {i: {"step": torch.tensor(1000.0),
                 **{a: 1e-3 * torch.rand(shape, generator=generator) for a in arrays}}
             for i, (_, shape) in enumerate(tensors)}
    checkpoint = {"model": model,
                  "optimizer": {"state": state,
                                "param_groups": [{"lr": 3e-4, "params": list(range(len(tensors)))}]},
                  "step": 1000}
    path = os.path.join(args.dir, f"pytorch_checkpoint_io_{os.getpid()}.pt")
    save_ms, load_ms, size = [], [], 0
    try:
        for _ in range(args.rounds):
            start = time.perf_counter()
            with open(path, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            save_ms.append(1e3 * (time.perf_counter() - start))
            size = os.path.getsize(path)
            start = time.perf_counter()
            loaded = torch.load(path, weights_only=True)
            load_ms.append(1e3 * (time.perf_counter() - start))
            first = tensors[0][0]
            if not torch.equal(loaded["model"][first], model[first]):
                fail(f"{path}: the tensor {first} read back differs from the one saved")
            del loaded
            os.remove(path)
    finally:
        if os.path.exists(path):
            os.remove(path)
    print(json.dumps({"framework": "pytorch", "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "checkpoint_bytes": size,
                      "save_ms": save_ms, "load_ms": load_ms,
                      "save_ms_median": statistics.median(save_ms),
                      "load_ms_median": statistics.median(load_ms)}))


if __name__ == "__main__":
    main()
