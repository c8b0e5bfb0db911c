#!/usr/bin/env python3
"""The DeepSpeed baseline for optimizer offload: transformers' LlamaForCausalLM of a tandem
config's shape trained by DeepSpeed 0.19 with its optimizer state in pinned host memory.

--zero-stage 2 is ZeRO-Offload (stage 2, offload_optimizer cpu, DeepSpeedCPUAdam);
--zero-stage 3 is ZeRO-3 with the optimizer offloaded the same way and the parameters left
on the GPU (no offload_param). Both bf16, AdamW with the config's hyperparameters at a
constant learning rate (tandem's benchmark runs use warm-up 0), the config's gradient
clipping and sub_group_size, no activation checkpointing, one process (world size 1, no
`deepspeed` launcher). Each step's forward, backward and update are timed to the GPU's
completion and logged to stderr; at the end one JSON object goes to stdout (medians over
the timed steps, peak GPU memory, the optimizer's pinned host bytes).

  tools/pack_deepspeed_wheels.sh     # with PyPI: DeepSpeed's wheel set in gpu-payload/wheels
  # on the GPU machine (no index there):
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --find-links gpu-payload/wheels deepspeed
  python3 bench/deepspeed_offload_train.py --config configs/llama2-7b.json --zero-stage 2
  python3 bench/deepspeed_offload_train.py --config configs/llama2-7b.json --print-ds-config

The arguments and the config are checked before torch is imported, and --print-ds-config
(the DeepSpeed config this run would use) needs neither torch nor a GPU.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

ME = "deepspeed_offload_train.py"
INSTALL = ("PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index "
           "--find-links gpu-payload/wheels deepspeed")
NO_GPU = f"{ME} needs a CUDA GPU (DeepSpeed's offload trains on one); none is visible here"


def fail(message):
    print(f"{ME}: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a tandem config with model.type llama")
    parser.add_argument("--zero-stage", type=int, default=2,
                        help="2: ZeRO-Offload; 3: ZeRO-3 with the optimizer offloaded")
    parser.add_argument("--batch", type=int, help="micro-batch (default: the config's)")
    parser.add_argument("--seq-len", type=int, help="sequence length (default: train.seq_len)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed")
    parser.add_argument("--data", help="llm.c token shard to train on (default: random tokens)")
    parser.add_argument("--lr", type=float,
                        help="the constant learning rate (default: the config's "
                             "optimizer.params.lr; tandem's side takes it as "
                             "--set optimizer.params.lr=LR)")
    parser.add_argument("--print-ds-config", action="store_true",
                        help="print the DeepSpeed config and exit (no torch, no GPU needed)")
    return parser.parse_args()


def load_config(path):
    """The tandem config at `path`, or exit 2 saying why it is not one."""
    try:
        with open(path) as f:
            config = json.load(f)
    except FileNotFoundError:
        fail(f"config file {path} does not exist; pass --config with a tandem config "
             "such as configs/llama2-7b.json")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        fail(f"config file {path} is not JSON ({e}); pass a tandem config "
             "such as configs/llama2-7b.json")
    if not isinstance(config, dict):
        fail(f"config file {path} is not a JSON object; pass a tandem config "
             "such as configs/llama2-7b.json")
    return config


def check_args(args, config):
    """Exit 2 on what cannot run; fill --batch and --seq-len from the config."""
    model_type = str(config.get("model", {}).get("type", "gpt2"))
    if model_type.lower() != "llama":
        fail(f"the config's model.type is {model_type!r}; this baseline trains a Llama: pass a "
             "config with model.type llama (e.g. configs/llama2-7b.json)")
    optimizer_type = str(config.get("optimizer", {}).get("type", "AdamW"))
    if optimizer_type.lower() != "adamw":
        fail(f"the config's optimizer.type is {optimizer_type!r}; this baseline is AdamW: "
             "pass a config whose optimizer is AdamW")
    if args.zero_stage not in (2, 3):
        fail(f"--zero-stage {args.zero_stage} is not benchmarked: pass --zero-stage 2 "
             "(ZeRO-Offload) or --zero-stage 3 (ZeRO-3, optimizer offloaded)")
    if args.batch is None:
        args.batch = int(config.get("train_micro_batch_size_per_gpu", 1))
    if args.seq_len is None:
        args.seq_len = int(config.get("train", {}).get("seq_len",
                           config["model"].get("max_position_embeddings", 1024)))
    for flag, value in (("--steps", args.steps), ("--batch", args.batch),
                        ("--seq-len", args.seq_len)):
        if value <= 0:
            fail(f"{flag} {value} is not positive; pass a positive {flag}")
    if args.lr is not None and not args.lr > 0:
        fail(f"--lr {args.lr} is not a positive learning rate; pass one such as 3e-5, or "
             "leave --lr out for the config's optimizer.params.lr")
    if args.warmup < 0:
        fail(f"--warmup {args.warmup} is negative; pass 0 or more")
    if args.data and not os.path.isfile(args.data):
        fail(f"--data {args.data}: no such file; write a token shard with "
             "`tandem tokenize --input TEXT --output FILE.bin`, or leave --data out "
             "for random tokens")


def deepspeed_config(args, config):
    """The DeepSpeed config (https://www.deepspeed.ai/docs/config-json/) of this run: one
    micro-batch per step on one GPU, bf16, the tandem config's clipping and AdamW."""
    params = config.get("optimizer", {}).get("params", {})
    zero = {
        "stage": args.zero_stage,
        # ZeRO-Offload: fp32 master weights, Adam moments (and the fp32 gradients DeepSpeed
        # copies to the host) in pinned host memory; DeepSpeedCPUAdam updates them.
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        # Stage 3 updates the optimizer state in subgroups of this many elements, as tandem
        # does; stage 2 has no subgroups and ignores it.
        "sub_group_size": int(config.get("zero_optimization", {}).get("sub_group_size", 10**9)),
        # As DeepSpeed's ZeRO-Offload tutorial configures it.
        "contiguous_gradients": True,
        "overlap_comm": True,
    }
    return {
        "train_batch_size": args.batch,  # world size 1, no accumulation
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": float(config.get("gradient_clipping", 1.0)),
        # With offload_optimizer, DeepSpeed builds DeepSpeedCPUAdam(adamw_mode=True) from this;
        # no "scheduler": a constant learning rate.
        "optimizer": {"type": "AdamW", "params": {
            # --lr, else the config's; tandem's defaults where the config is silent.
            "lr": args.lr if args.lr is not None else float(params.get("lr", 1e-3)),
            "betas": [float(b) for b in params.get("betas", [0.9, 0.95])],
            "eps": float(params.get("eps", 1e-8)),
            "weight_decay": float(params.get("weight_decay", 0.1))}},
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        # No activation checkpointing: transformers' gradient checkpointing stays off and the
        # config has no "activation_checkpointing" section.
        "steps_per_print": 2**31 - 1,  # the step lines here replace DeepSpeed's
        "wall_clock_breakdown": False,
    }


def import_torch():
    """torch, once it is known to see a CUDA GPU; exit 2 otherwise."""
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is not installed ({e}); install torch with CUDA (the GPU machine has it)")
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        sys.exit(2)
    return torch


def import_deepspeed():
    try:
        import deepspeed
    except ImportError as e:
        fail(f"DeepSpeed is not installed ({e}); make its wheel set with "
             f"tools/pack_deepspeed_wheels.sh and install it: {INSTALL}")
    return deepspeed


def stdout_for_the_result():
    """A handle on stdout for the one JSON line; from now on whatever else writes to stdout
    (DeepSpeed's logger, ninja, the ops' C++) goes to stderr, so stdout stays parseable."""
    sys.stdout.flush()
    result = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return result


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(deepspeed):
    """One rank, without the `deepspeed` launcher: its environment, unless already set."""
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    deepspeed.init_distributed(dist_backend="nccl")


def build_cpu_adam():
    """JIT-compiles DeepSpeed's CPU Adam op (ninja) before the engine needs it, so that its
    build time is reported apart from the engine's start. Returns seconds."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/torch_extensions_deepspeed")
    from deepspeed.ops.op_builder import CPUAdamBuilder
    start = time.perf_counter()
    try:
        CPUAdamBuilder().load()
    except Exception as e:  # a compiler, Python's headers or ninja missing: say which op
        print(f"{ME}: building DeepSpeed's CPU Adam op failed ({type(e).__name__}: {e}); it "
              "needs g++, ninja and Python's headers", file=sys.stderr)
        raise
    seconds = time.perf_counter() - start
    print(f"cpu_adam op built in {seconds:.1f} s "
          f"(TORCH_EXTENSIONS_DIR={os.environ['TORCH_EXTENSIONS_DIR']})", file=sys.stderr)
    return seconds


def build_model(torch, deepspeed, cfg, ds_config, stage):
    """LlamaForCausalLM in bf16 straight on the GPU (no fp32 or host copy first). Stage 3
    builds it under deepspeed.zero.Init(ds_config), each module's weights partitioned as soon
    as it exists, and then initialises them as transformers does its own ZeRO-3 models."""
    from transformers import LlamaForCausalLM
    start = time.perf_counter()
    if stage == 3:
        # transformers does this itself once HfDeepSpeedConfig tells it of ZeRO-3, but that
        # needs accelerate, which the GPU machine lacks: torch's and transformers' weight
        # initialisation skipped while the shards are empty, then each module's weights
        # gathered and initialised (bf16 on the GPU, one module at a time).
        from transformers import initialization
        from transformers.integrations.deepspeed import initialize_weights_zero3
        with initialization.no_init_weights(), deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
        if not all(hasattr(p, "ds_id") for p in model.parameters()):
            raise RuntimeError("the model's parameters were not partitioned by deepspeed.zero.Init")
        initialize_weights_zero3(model)
    else:
        with torch.device("cuda"):
            model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(f"model built in {seconds:.1f} s", file=sys.stderr)
    return model, seconds


def parameter_groups(model):
    """AdamW's groups as tandem decays them: 2-D weights decay (the config's weight_decay,
    the group default), the norms' 1-D weights do not."""
    # ZeRO-3 leaves each parameter an empty tensor; ds_shape is its real shape.
    def dims(p):
        return len(getattr(p, "ds_shape", p.shape))
    return [{"params": [p for p in model.parameters() if dims(p) >= 2]},
            {"params": [p for p in model.parameters() if dims(p) < 2], "weight_decay": 0.0}]


def parameter_count(model):
    # ZeRO-3 leaves each parameter an empty tensor; ds_numel is its real size.
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def warn_if_host_memory_short(params, stage):
    """The host must hold 12 B/param of fp32 master weights and Adam moments and 4 B/param of
    fp32 gradients (both stages offload them), and a 2 B/param bf16 staging copy; warn only,
    since what the OS can pin is not exactly what psutil calls available."""
    try:
        import psutil
    except ImportError:
        return
    need = params * (12 + 4 + 2)
    available = psutil.virtual_memory().available
    if need > available:
        print(f"{ME}: warning: ZeRO-{stage} offload of {params / 1e9:.2f} B parameters needs about "
              f"{need / 2**30:.1f} GiB of host memory and {available / 2**30:.1f} GiB is "
              "available; the run may fail to pin it or swap", file=sys.stderr)


def host_tensor_bytes(torch, optimizer):
    """(pinned, all) bytes of the CPU tensors that DeepSpeed's ZeRO optimizer holds: whatever
    its attributes reach through lists, tuples and dicts, with each tensor's .grad, and the
    inner DeepSpeedCPUAdam's state. That is, at stage 2, the fp32 partitions
    (single_partition_of_fp32_groups) and their fp32 .grad, the bf16 staging copy
    (param_buffer_of_bit16_for_cpu_offload_groups) and the gradient staging buffers; at
    stage 3, fp32_partitioned_groups_flat and their .grad, grad_partitions_flat_buffer and
    lp_param_buffer; at both, Adam's exp_avg and exp_avg_sq (CPU Adam makes them with
    zeros_like, so they may be pageable rather than pinned: `all` counts them either way).
    Each storage is counted once, whole; the GPU's tensors not at all."""
    seen_storage, seen_container = set(), set()
    pinned = total = 0
    inner = getattr(optimizer, "optimizer", None)
    stack = [vars(optimizer)] + ([inner.state, inner.param_groups] if inner is not None else [])
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if obj.is_leaf and obj.grad is not None:
                stack.append(obj.grad)
            if obj.device.type != "cpu":
                continue
            storage = obj.untyped_storage()
            if storage.data_ptr() in seen_storage or storage.nbytes() == 0:
                continue
            seen_storage.add(storage.data_ptr())
            total += storage.nbytes()
            if obj.is_pinned():
                pinned += storage.nbytes()
        elif isinstance(obj, (list, tuple, dict)) and id(obj) not in seen_container:
            seen_container.add(id(obj))
            # keys and values, not items(): a short-lived pair's id can come back for the next
            stack.extend(list(obj.keys()) + list(obj.values()) if isinstance(obj, dict) else obj)
    return pinned, total


def host_rss_bytes():
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process().memory_info().rss


def train(torch, engine, batch, vocab_size, warmup, steps, tokens_per_step):
    """warmup + steps steps, each forward / backward / update timed to the GPU's completion.
    Returns the timed steps' (forward, backward, update) seconds and every step's loss."""
    times, losses = [], []
    for step in range(warmup + steps):
        x, y = batch(step)
        marks = []
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        logits = engine(input_ids=x).logits
        # fp32 cross-entropy over the bf16 logits, as the PyTorch baseline computes it
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab_size), y.view(-1))
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        engine.backward(loss)
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        engine.step()  # clipping, CPU Adam on the host, bf16 weights back to the GPU
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        phases = [b - a for a, b in zip(marks, marks[1:])]
        if step >= warmup:
            times.append(phases)
        losses.append(loss.item())
        elapsed = marks[-1] - marks[0]
        print(f"step {step + 1}: loss {losses[-1]:.4f}, {elapsed * 1e3:.1f} ms (forward "
              f"{phases[0] * 1e3:.1f}, backward {phases[1] * 1e3:.1f}, update "
              f"{phases[2] * 1e3:.1f}), {tokens_per_step / elapsed:.0f} tok/s", file=sys.stderr)
    return times, losses


def median_ms(values):
    return round(statistics.median(values) * 1e3, 3) if values else None


def main():
    args = parse_args()
    config = load_config(args.config)
    check_args(args, config)
    ds_config = deepspeed_config(args, config)
    if args.print_ds_config:
        print(json.dumps(ds_config, indent=2))
        return

    torch = import_torch()
    result = stdout_for_the_result()
    deepspeed = import_deepspeed()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pytorch_gpt2_train import batch_maker
    from pytorch_llama_train import llama_config

    init_distributed(deepspeed)
    cpu_adam_s = build_cpu_adam()
    torch.manual_seed(int(config.get("train", {}).get("seed", 1337)))
    cfg = llama_config(config["model"])
    model, construct_s = build_model(torch, deepspeed, cfg, ds_config, args.zero_stage)
    params = parameter_count(model)
    warn_if_host_memory_short(params, args.zero_stage)
    engine, optimizer, _, _ = deepspeed.initialize(model=model,
                                                   model_parameters=parameter_groups(model),
                                                   config=ds_config)
    print(f"engine ready: {type(optimizer).__name__} over {type(optimizer.optimizer).__name__}, "
          f"{params:,} parameters", file=sys.stderr)

    B, T = args.batch, args.seq_len
    batch = batch_maker(args.data, cfg.vocab_size, B, T, torch.device("cuda"))
    times, losses = train(torch, engine, batch, cfg.vocab_size, args.warmup, args.steps, B * T)
    pinned, host_tensors = host_tensor_bytes(torch, optimizer)
    print(json.dumps({
        "framework": "deepspeed", "deepspeed": deepspeed.__version__,
        "torch": torch.__version__, "zero_stage": args.zero_stage, "offload": "cpu",
        "params": params, "batch": B, "seq_len": T, "data": args.data or "random tokens",
        "tokens_per_s": statistics.median([B * T / sum(t) for t in times]),
        "ms": median_ms([sum(t) for t in times]),
        "forward_ms": median_ms([t[0] for t in times]),
        "backward_ms": median_ms([t[1] for t in times]),
        "update_ms": median_ms([t[2] for t in times]),
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        "pinned_host_bytes": pinned, "optimizer_host_bytes": host_tensors,
        "host_rss_bytes": host_rss_bytes(),
        "cpu_adam_build_s": round(cpu_adam_s, 3), "construct_s": round(construct_s, 3),
        "losses": [round(v, 4) for v in losses],
        "gpu": torch.cuda.get_device_name(), "config": args.config}), file=result, flush=True)


if __name__ == "__main__":
    main()
