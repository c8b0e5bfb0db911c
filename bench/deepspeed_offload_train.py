#!/usr/bin/env python3
"""The DeepSpeed baseline: transformers' LlamaForCausalLM of a tandem config's shape trained by
DeepSpeed 0.19 on one GPU, at the settings DeepSpeed's own documentation, code and issues
recommend (bench/README.md, "tandem against DeepSpeed", says where each comes from).

Modes (--mode):
  zero2           ZeRO-2 with no offload: bf16 weights and gradients, fp32 master weights
                  and Adam moments all on the GPU, DeepSpeed's FusedAdam (what DeepSpeed
                  runs when the 16 bytes per parameter of training state fit the GPU);
  zero2-offload   ZeRO-Offload: ZeRO-2 with offload_optimizer cpu (DeepSpeedCPUAdam on the
                  host, fp32 state and gradients in pinned host memory);
  zero3-offload   ZeRO-3 with the optimizer offloaded the same way, parameters on the GPU
                  (stage3_param_persistence_threshold so large that no parameter is ever
                  released on one GPU), the config's sub_group_size;
  zero3-twinflow  ZeRO-3 with a partial offload: offload_optimizer.ratio R of the subgroups
                  updated by CPU Adam on the host, the rest by torch AdamW on the GPU
                  ("Twin-Flow", ZeRO-Offload++; ZeRO-3 only);
  best            the mode, micro-batch, accumulation and activation checkpointing that
                  bench/deepspeed_memory.py finds fit this machine's GPU and host memory, per
                  train batch (--micro-batch is then the largest micro-batch known to fit
                  without checkpointing); a train batch that nothing fits is not run, and its
                  JSON line says why. --print-plan prints the choice.
--zero-stage 2|3 is the old spelling of zero2-offload|zero3-offload.

Batch: --train-batch-size sequences per optimizer step (a comma list runs one phase per
value in one process, the engine built once: DeepSpeed's set_train_micro_batch_size and
set_train_batch_size change the micro-batch and the accumulation), --micro-batch (one, or one
per phase), --grad-accum (train_batch_size = micro x accumulation on one GPU);
--activation-checkpointing (transformers' gradient checkpointing, every layer; in every phase,
or per phase: 0,1);
--find-largest-micro-batch tries micro-batches 1, 2, 4, ... up to the train batch on the built
engine (one full step each) until one runs out of GPU memory, prints the largest that ran and
exits. Learning rate: tandem's WarmupCosineLR exactly (linear warm-up to lr over W steps, then
cosine to lr x cos_min_ratio at the phase's last step), a torch LambdaLR. Each phase runs
--warmup untimed steps (default 5, also W unless --lr-warmup-steps) and --steps timed ones
(default 20), and prints one JSON line: medians, every step's loss, peak GPU memory, pinned
host bytes, torch.cuda.host_memory_stats() and resident memory after the first step.

Host memory: torch's pinned allocator rounds every block up to a power of two (ATen's
CachingHostAllocator: PowerOf2Ceil, whatever PYTORCH_ALLOC_CONF says; its
pinned_use_cuda_host_register still registers the rounded size). --pinned exact (default on a
GPU) pins DeepSpeed's offload buffers at their exact size instead: DeepSpeed asks its
accelerator's pin_memory for every such buffer, and the script gives it an ordinary host
tensor registered with cudaHostRegister (what torch does under pinned_use_cuda_host_register,
without the rounding); --pinned torch is DeepSpeed's default; --pinned off is
offload_optimizer.pin_memory false.

  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --find-links gpu-payload/wheels deepspeed
  python3 bench/deepspeed_offload_train.py --config configs/llama2-7b.json --mode zero2-offload \\
      --train-batch-size 4,16 --micro-batch 2
  python3 bench/deepspeed_offload_train.py --config configs/llama2-7b.json --print-ds-config

The arguments and the config are checked before torch is imported; --print-ds-config and
--print-lr-schedule need neither torch nor a GPU. --device cpu runs the same loop on DeepSpeed's
CPU accelerator (DS_ACCELERATOR=cpu, gloo, no pinning): a dry run, not a benchmark.
"""
import argparse
import glob
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time

import deepspeed_memory

ME = "deepspeed_offload_train.py"
INSTALL = ("PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index "
           "--find-links gpu-payload/wheels deepspeed")
NO_GPU = f"{ME} needs a CUDA GPU (DeepSpeed's offload trains on one); none is visible here"
MODES = {"zero2": (2, False), "zero2-offload": (2, True), "zero3-offload": (3, True),
         "zero3-twinflow": (3, True)}
# PyTorch's device allocator: expandable segments cut the fragmentation that large, varying
# activations leave, so the largest micro-batch is larger (PyTorch's CUDA semantics notes).
DEFAULT_ALLOC_CONF = "expandable_segments:True"


def fail(message):
    print(f"{ME}: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a tandem config with model.type llama")
    parser.add_argument("--mode", choices=sorted(MODES) + ["best"],
                        help="default zero2-offload")
    parser.add_argument("--zero-stage", type=int,
                        help="old spelling: 2 is --mode zero2-offload, 3 is zero3-offload")
    parser.add_argument("--train-batch-size",
                        help="sequences per optimizer step, or a comma list of them (one phase "
                             "each; default micro-batch x accumulation)")
    parser.add_argument("--micro-batch", "--batch", dest="micro_batch",
                        help="sequences per forward, or a comma list of one per phase "
                             "(default: the config's train_micro_batch_size_per_gpu)")
    parser.add_argument("--grad-accum", type=int,
                        help="micro-batches per optimizer step (default: train batch / micro)")
    parser.add_argument("--seq-len", type=int, help="sequence length (default: train.seq_len)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per phase")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per phase")
    parser.add_argument("--lr", type=float, help="peak learning rate (default: the config's)")
    parser.add_argument("--lr-warmup-steps", type=int,
                        help="WarmupCosineLR's warmup_num_steps (default: --warmup)")
    parser.add_argument("--cos-min-ratio", type=float,
                        help="WarmupCosineLR's floor (default: the config's, else 0.1)")
    parser.add_argument("--activation-checkpointing", nargs="?", const="1",
                        help="recompute every layer's activations in the backward: in every "
                             "phase, or per phase as a comma list of 0 and 1")
    parser.add_argument("--gpu-memory-gb", type=float,
                        help="GPU memory DeepSpeed may use, GiB, for --mode best and the memory "
                             "check (default: the GPU's, less 3 GiB)")
    parser.add_argument("--host-memory-gb", type=float,
                        help="host memory DeepSpeed may use, GiB (default: MemAvailable)")
    parser.add_argument("--reduce-bucket-size", type=float, default=5e8,
                        help="zero_optimization.reduce_bucket_size (elements; DeepSpeed's "
                             "default 5e8)")
    parser.add_argument("--sub-group-size", type=float,
                        help="zero_optimization.sub_group_size (default: the config's)")
    parser.add_argument("--param-persistence-threshold", type=float, default=1e10,
                        help="stage3_param_persistence_threshold (default 1e10: every "
                             "parameter stays gathered on the one GPU)")
    parser.add_argument("--offload-ratio", type=float,
                        help="zero3-twinflow: offload_optimizer.ratio, the share of subgroups "
                             "updated on the host (default 0.5)")
    parser.add_argument("--pinned", choices=("exact", "torch", "off"),
                        help="how offload buffers are pinned (default exact on a GPU)")
    parser.add_argument("--gpu-adam", choices=("torch-fused", "deepspeed-fused"),
                        default="torch-fused",
                        help="zero2's optimizer: torch's fused AdamW (torch_adam) or "
                             "DeepSpeed's FusedAdam (JIT-built with nvcc)")
    parser.add_argument("--alloc-conf", default=DEFAULT_ALLOC_CONF,
                        help="PYTORCH_ALLOC_CONF, checked in a child process first; '' for none")
    parser.add_argument("--no-bind-cores", dest="bind_cores", action="store_false",
                        help="leave CPU affinity and OMP_NUM_THREADS as they are")
    parser.add_argument("--wall-clock-breakdown", action="store_true",
                        help="DeepSpeed's own forward/backward/step timers in the log")
    parser.add_argument("--find-largest-micro-batch", action="store_true",
                        help="try micro-batches 1, 2, 4, ... and print the largest that fits")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: DeepSpeed's CPU accelerator, a dry run of the loop")
    parser.add_argument("--data", help="llm.c token shard to train on (default: random tokens)")
    parser.add_argument("--print-ds-config", action="store_true",
                        help="print the DeepSpeed config of the first phase and exit")
    parser.add_argument("--print-plan", action="store_true",
                        help="print every phase's mode, micro-batch, accumulation, "
                             "checkpointing and memory estimates, and exit")
    parser.add_argument("--print-lr-schedule", action="store_true",
                        help="print each step's learning rate of the first phase and exit")
    return parser.parse_args(argv)


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


def int_list(flag, text):
    """A comma list of integers (None stays None), or exit 2 naming the flag."""
    if text is None:
        return None
    try:
        return [int(v) for v in str(text).split(",")]
    except ValueError:
        fail(f"{flag} {text} is not a number or a comma list of numbers; pass e.g. 16 or 4,16")


def gpu_memory_bytes(args):
    """--gpu-memory-gb, else the first GPU's memory (nvidia-smi) less 3 GiB for the CUDA
    context and cuBLAS, as bench/gpu_offload_sweep.sh gives tandem; exit 2 without either."""
    if args.gpu_memory_gb is not None:
        return args.gpu_memory_gb * deepspeed_memory.GIB
    try:
        mib = subprocess.run(["nvidia-smi", "--query-gpu=memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, check=True).stdout.split()[0]
        return (int(mib) / 1024 - 3) * deepspeed_memory.GIB
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        fail("--mode best needs the GPU's memory and nvidia-smi did not give it; pass "
             "--gpu-memory-gb")


def host_memory_bytes(args):
    if args.host_memory_gb is not None:
        return args.host_memory_gb * deepspeed_memory.GIB
    available = deepspeed_memory.available_host_bytes()
    if available is None:
        fail("/proc/meminfo has no MemAvailable to plan host memory by; pass --host-memory-gb")
    return available


def plan_best_phases(args, config, micros):
    """--mode best: bench/deepspeed_memory.py's plan for the train batch sizes, which also sets
    args.mode. --micro-batch (one value) is the largest known to fit without checkpointing."""
    if micros is not None and len(micros) != 1:
        fail("--mode best takes one --micro-batch (the largest that fits without activation "
             "checkpointing), not one per phase")
    if args.offload_ratio is not None:
        fail("--mode best chooses Twin-Flow's --offload-ratio itself (where it is the mode); "
             "leave it out, or name --mode zero3-twinflow")
    shape = deepspeed_memory.llama_shape(config["model"])
    args.mode, ratio, phases, why = deepspeed_memory.plan_best(
        shape, args.train_batch_sizes, args.seq_len, gpu_memory_bytes(args),
        host_memory_bytes(args), args.reduce_bucket_size, micros[0] if micros else None)
    if args.mode == "zero3-twinflow":
        args.offload_ratio = ratio
    return phases, why


def check_host_memory(args, config):
    """A warning where the chosen mode's host memory estimate (bench/deepspeed_memory.py) is
    more than the host has available: the kernel's out-of-memory killer would end the run."""
    shape = deepspeed_memory.llama_shape(config["model"])
    accumulates = any(p["gradient_accumulation_steps"] > 1 for p in args.phases
                      if "not_run" not in p)
    need = deepspeed_memory.host_bytes(args.mode, shape, accumulates, args.offload_ratio)
    available = host_memory_bytes(args)
    if need > available:
        print(f"{ME}: warning: {args.mode} needs about {need / deepspeed_memory.GIB:.1f} GiB of "
              f"host memory{' with accumulation' if accumulates else ''}, more than the "
              f"{available / deepspeed_memory.GIB:.1f} GiB available; it may be killed "
              "(--mode best plans within it)", file=sys.stderr)


def log_best_plan(args):
    """--mode best's choice, one line per phase, on stderr (the part's log)."""
    print(f"{ME}: best: {args.plan_why}", file=sys.stderr)
    for p in args.phases:
        print(f"{ME}: best: {p['train_batch_size']} sequences: " + (
            f"not run: {p['not_run']}" if "not_run" in p else
            f"micro-batch {p['micro_batch']} x {p['gradient_accumulation_steps']}"
            f"{', activation checkpointing' if p['activation_checkpointing'] else ''}"
            f" (about {p['gpu_bytes'] / deepspeed_memory.GIB:.1f} GiB of GPU and "
            f"{p['host_bytes'] / deepspeed_memory.GIB:.1f} GiB of host memory)"),
            file=sys.stderr)


def print_phases_not_run(args, config):
    """Every phase's JSON line with why it is not run, when no phase can run here."""
    shape = deepspeed_memory.llama_shape(config["model"])
    for phase, p in enumerate(args.phases):
        print(json.dumps(dict(
            p, framework="deepspeed", mode=args.mode, zero_stage=args.stage,
            config=args.config, params=shape["params"], seq_len=args.seq_len,
            phase=phase + 1, batch=p["micro_batch"],
            tokens_per_step=p["train_batch_size"] * args.seq_len)))


def check_phases(args, config):
    """args.phases: each train batch's micro-batch, accumulation and activation checkpointing
    (from the flags, or --mode best's plan, which also names the mode); args.stage,
    args.offload and args.micro_batch (the engine's first) follow. Exit 2 on what cannot run."""
    micros = given_micros = int_list("--micro-batch", args.micro_batch)
    for flag, values in (("--steps", [args.steps]), ("--micro-batch", micros or []),
                         ("--grad-accum", [args.grad_accum]), ("--seq-len", [args.seq_len])):
        for value in values:
            if value is not None and value <= 0:
                fail(f"{flag} {value} is not positive; pass a positive {flag}")
    checkpointing = int_list("--activation-checkpointing", args.activation_checkpointing)
    if checkpointing and any(v not in (0, 1) for v in checkpointing):
        fail(f"--activation-checkpointing {args.activation_checkpointing}: give nothing (every "
             "phase) or one 0 or 1 per phase, such as 0,1")
    if args.train_batch_size is not None:
        args.train_batch_sizes = int_list("--train-batch-size", args.train_batch_size)
        if any(v <= 0 for v in args.train_batch_sizes):
            fail(f"--train-batch-size {args.train_batch_size} is not positive; pass sequences "
                 "per optimizer step such as 16")
        if args.grad_accum is not None and len(args.train_batch_sizes) > 1:
            fail("--grad-accum with several --train-batch-size values: give --micro-batch; "
                 "each phase's accumulation is its batch / micro-batch")
        if micros is None:
            micros = [args.train_batch_sizes[0] // args.grad_accum if args.grad_accum else
                      min(int(config.get("train_micro_batch_size_per_gpu", 1)),
                          min(args.train_batch_sizes))]
    else:
        if micros is None:
            micros = [int(config.get("train_micro_batch_size_per_gpu", 1))]
        args.train_batch_sizes = [micros[0] * (args.grad_accum or 1)]
    phases = len(args.train_batch_sizes)
    for flag, values in (("--micro-batch", micros), ("--activation-checkpointing", checkpointing)):
        if values is not None and len(values) not in (1, phases):
            fail(f"{flag} gives {len(values)} values for {phases} train batch sizes: give one "
                 "for every phase, or one per phase")
    args.best = args.mode == "best"
    if args.best:
        if checkpointing is not None or args.grad_accum is not None:
            fail("--mode best chooses the accumulation and activation checkpointing itself: "
                 "leave out --grad-accum and --activation-checkpointing, or name a mode")
        args.phases, args.plan_why = plan_best_phases(args, config, given_micros)
    else:
        if len(micros) == 1:
            micros = micros * phases
        if checkpointing is None or len(checkpointing) == 1:
            checkpointing = (checkpointing or [0]) * phases
        args.phases, args.plan_why = [], None
        for tbs, micro, ckpt in zip(args.train_batch_sizes, micros, checkpointing):
            if tbs % micro:
                fail(f"--train-batch-size {tbs} is not a multiple of the micro-batch "
                     f"{micro}: DeepSpeed needs train_batch_size = micro-batch x "
                     "accumulation on one GPU; pass a micro-batch that divides it")
            args.phases.append({"train_batch_size": tbs, "micro_batch": micro,
                                "gradient_accumulation_steps": tbs // micro,
                                "activation_checkpointing": bool(ckpt)})
    if args.grad_accum is not None and args.train_batch_sizes[0] != micros[0] * args.grad_accum:
        fail(f"--train-batch-size {args.train_batch_sizes[0]} is not --micro-batch "
             f"{micros[0]} x --grad-accum {args.grad_accum}; give two of the three")
    args.stage, args.offload = MODES[args.mode]
    # The DeepSpeed config at the engine's start: the first phase that runs.
    first = next((p for p in args.phases if "not_run" not in p), args.phases[0])
    args.micro_batch = first["micro_batch"]


def check_args(args, config):
    """Exit 2 on what cannot run; fill mode, batch sizes, sequence and schedule defaults."""
    model_type = str(config.get("model", {}).get("type", "gpt2"))
    if model_type.lower() != "llama":
        fail(f"the config's model.type is {model_type!r}; this baseline trains a Llama: pass a "
             "config with model.type llama (e.g. configs/llama2-7b.json)")
    optimizer_type = str(config.get("optimizer", {}).get("type", "AdamW"))
    if optimizer_type.lower() != "adamw":
        fail(f"the config's optimizer.type is {optimizer_type!r}; this baseline is AdamW: "
             "pass a config whose optimizer is AdamW")
    if args.zero_stage is not None:
        if args.zero_stage not in (2, 3):
            fail(f"--zero-stage {args.zero_stage} is not benchmarked: pass --zero-stage 2 "
                 "(ZeRO-Offload) or --zero-stage 3 (ZeRO-3, optimizer offloaded), or --mode")
        old = "zero2-offload" if args.zero_stage == 2 else "zero3-offload"
        if args.mode not in (None, old):
            fail(f"--zero-stage {args.zero_stage} and --mode {args.mode} disagree; pass one")
        args.mode = old
    args.mode = args.mode or "zero2-offload"
    if args.seq_len is None:
        args.seq_len = int(config.get("train", {}).get("seq_len",
                           config["model"].get("max_position_embeddings", 1024)))
    check_phases(args, config)
    if args.lr is not None and not args.lr > 0:
        fail(f"--lr {args.lr} is not a positive learning rate; pass one such as 3e-5, or "
             "leave --lr out for the config's optimizer.params.lr")
    if args.warmup < 0:
        fail(f"--warmup {args.warmup} is negative; pass 0 or more")
    if args.lr_warmup_steps is None:
        args.lr_warmup_steps = args.warmup
    if args.lr_warmup_steps < 0:
        fail(f"--lr-warmup-steps {args.lr_warmup_steps} is negative; pass 0 or more")
    scheduler = config.get("scheduler", {}).get("params", {})
    if args.cos_min_ratio is None:
        args.cos_min_ratio = float(scheduler.get("cos_min_ratio", 0.1))
    if not 0 <= args.cos_min_ratio <= 1:
        fail(f"--cos-min-ratio {args.cos_min_ratio} is not in [0, 1]")
    if args.mode != "zero3-twinflow" and args.offload_ratio is not None:
        fail(f"--offload-ratio is zero3-twinflow's (DeepSpeed allows a partial offload only at "
             f"ZeRO-3); --mode {args.mode} offloads all or nothing")
    if args.offload_ratio is None:
        args.offload_ratio = 0.5
    if not 0 <= args.offload_ratio <= 1:
        fail(f"--offload-ratio {args.offload_ratio} is not in [0, 1]: it is the share of the "
             "optimizer state on the host")
    if args.reduce_bucket_size <= 0:
        fail(f"--reduce-bucket-size {args.reduce_bucket_size:g} is not positive")
    if args.sub_group_size is None:
        args.sub_group_size = float(config.get("zero_optimization", {}).get("sub_group_size", 1e9))
    if args.sub_group_size <= 0:
        fail(f"--sub-group-size {args.sub_group_size:g} is not positive")
    if args.pinned is None:
        args.pinned = "exact" if args.device == "cuda" and args.offload else "off"
    if args.device == "cpu" and args.pinned != "off":
        fail(f"--pinned {args.pinned} needs a GPU; the cpu device pins nothing (--pinned off)")
    if args.data and not os.path.isfile(args.data):
        fail(f"--data {args.data}: no such file; write a token shard with "
             "`tandem tokenize --input TEXT --output FILE.bin`, or leave --data out "
             "for random tokens")


def lr_at(step, base_lr, warmup_steps, total_steps, min_ratio):
    """tandem's WarmupCosineSchedule::lr_at (src/tandem/optim/lr_schedule.cc), 0-based step:
    base_lr (step + 1) / W during warm-up, then cosine from base_lr to base_lr x min_ratio,
    reached at total_steps."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    min_lr = base_lr * min_ratio
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (base_lr - min_lr)


def base_lr(args, config):
    return args.lr if args.lr is not None else float(
        config.get("optimizer", {}).get("params", {}).get("lr", 1e-3))


def deepspeed_config(args, config, train_batch_size):
    """The DeepSpeed config (https://www.deepspeed.ai/docs/config-json/) of one phase."""
    params = config.get("optimizer", {}).get("params", {})
    zero = {
        "stage": args.stage,
        # As DeepSpeed's ZeRO-Offload tutorial configures it.
        "contiguous_gradients": True,
        "overlap_comm": True,
        # Elements reduced at a time (DeepSpeed's default 5e8); --reduce-bucket-size tunes it.
        "reduce_bucket_size": int(args.reduce_bucket_size),
    }
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": args.pinned != "off"}
        if args.mode == "zero3-twinflow":
            zero["offload_optimizer"]["ratio"] = args.offload_ratio
    if args.stage == 3:
        # One GPU holds the whole bf16 model anyway: keep every parameter gathered (no
        # release and re-gather per layer), and update the state in the config's subgroups.
        zero["stage3_param_persistence_threshold"] = int(args.param_persistence_threshold)
        zero["sub_group_size"] = int(args.sub_group_size)
    return {
        "train_batch_size": train_batch_size,  # world size 1
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": train_batch_size // args.micro_batch,
        "gradient_clipping": float(config.get("gradient_clipping", 1.0)),
        # Offloaded: DeepSpeedCPUAdam(adamw_mode=True). zero2: torch's fused AdamW through
        # DeepSpeed's torch_adam (its other parameters go to torch.optim.AdamW), or
        # DeepSpeed's FusedAdam (--gpu-adam deepspeed-fused: a JIT build that needs nvcc).
        # No "scheduler": the script's LambdaLR is tandem's WarmupCosineLR.
        "optimizer": {"type": "AdamW", "params": dict({
            "lr": base_lr(args, config),
            "betas": [float(b) for b in params.get("betas", [0.9, 0.95])],
            "eps": float(params.get("eps", 1e-8)),
            "weight_decay": float(params.get("weight_decay", 0.1))},
            **({"torch_adam": True, "fused": args.device == "cuda"}
               if not args.offload and args.gpu_adam == "torch-fused" else {}))},
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "steps_per_print": 2**31 - 1,  # the step lines here replace DeepSpeed's
        "wall_clock_breakdown": bool(args.wall_clock_breakdown),
    }


def physical_cores():
    """Physical cores this process may run on (one CPU per core), as DeepSpeed's
    --bind_cores_to_rank counts them (psutil.cpu_count(logical=False))."""
    allowed = sorted(os.sched_getaffinity(0))
    seen, cores = set(), []
    for cpu in allowed:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{base}/physical_package_id") as f:
                package = f.read().strip()
            with open(f"{base}/core_id") as f:
                core = f.read().strip()
        except OSError:
            package, core = "0", str(cpu)
        if (package, core) not in seen:
            seen.add((package, core))
            cores.append(cpu)
    return cores


def bind_cores(args):
    """What `deepspeed --bind_cores_to_rank` does for one rank: the process on the physical
    cores (one hardware thread each) and OMP_NUM_THREADS their count, so CPU Adam's OpenMP
    threads do not share cores (DeepSpeed's ZeRO-Offload tutorial, "CPU Adam perf tuning").
    Before torch is imported."""
    if not args.bind_cores:
        return None
    cores = physical_cores()
    os.sched_setaffinity(0, cores)
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    return cores


def check_alloc_conf(conf):
    """PYTORCH_ALLOC_CONF=conf if this machine's torch accepts it (a child process allocates
    on the GPU under it), else none. Returns (conf or None, why)."""
    if not conf:
        return None, "none asked"
    env = dict(os.environ, PYTORCH_ALLOC_CONF=conf)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    probe = ("import torch; torch.empty(1 << 20, device='cuda'); "
             "torch.empty(1 << 20, pin_memory=True)")
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    if r.returncode == 0 and "nrecognized" not in r.stderr:
        os.environ["PYTORCH_ALLOC_CONF"] = conf
        return conf, "accepted"
    why = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:200]
    print(f"{ME}: PYTORCH_ALLOC_CONF={conf} refused by this torch ({why}); running without it",
          file=sys.stderr)
    return None, f"refused: {why}"


def import_torch(device):
    """torch, once it is known to see a CUDA GPU (for --device cuda); exit 2 otherwise."""
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is not installed ({e}); install torch with CUDA (the GPU machine has it)")
    if device == "cuda" and not torch.cuda.is_available():
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


class ExactPinning:
    """DeepSpeed's offload buffers pinned at their exact size. DeepSpeed pins every ZeRO
    offload buffer through get_accelerator().pin_memory(tensor) (stage_1_and_2.py and
    stage3.py); torch's tensor.pin_memory() behind it takes a block of the next power of two
    from ATen's CachingHostAllocator. Here each buffer is an ordinary host tensor of its own
    size, page-locked and mapped with cudaHostRegister (as torch's pinned_use_cuda_host_register
    path does, without the rounding): tensor.is_pinned() is true and copies are asynchronous.
    A buffer is unregistered when its tensor object is collected."""

    def __init__(self, torch, accelerator):
        import weakref
        self.torch, self.weakref = torch, weakref
        self.cudart = torch.cuda.cudart()
        self.bytes = self.peak = self.count = 0
        self.original = accelerator.pin_memory
        accelerator.pin_memory = self.pin

    def pin(self, tensor, *args, **kwargs):
        torch = self.torch
        if tensor.device.type != "cpu" or tensor.is_pinned():
            return self.original(tensor, *args, **kwargs)
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
        out.copy_(tensor)
        nbytes = out.untyped_storage().nbytes()
        if nbytes == 0:
            return out
        ptr = out.data_ptr()
        err = self.cudart.cudaHostRegister(ptr, nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed ({err}); run with "
                               "--pinned torch or --pinned off")
        self.bytes += nbytes
        self.count += 1
        self.peak = max(self.peak, self.bytes)
        self.weakref.finalize(out, self._unregister, ptr, nbytes)
        return out

    def _unregister(self, ptr, nbytes):
        self.cudart.cudaHostUnregister(ptr)
        self.bytes -= nbytes


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


def build_cpu_adam():
    """JIT-compiles DeepSpeed's CPU Adam op (ninja) before the engine needs it, so that its
    build time is reported apart from the engine's start. Returns seconds."""
    extensions = os.environ.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/torch_extensions_deepspeed")
    from deepspeed.ops.op_builder import CPUAdamBuilder
    # torch's JIT build waits, silently and without end, while its build folder holds a lock
    # file; a build killed midway (a part's time limit) leaves one behind.
    for lock in glob.glob(os.path.join(extensions, "cpu_adam*", "lock")):
        print(f"{ME}: {lock} exists: waiting for another build of the cpu_adam op; if none runs, "
              "a killed build left it, and removing it ends the wait", file=sys.stderr)
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


def build_model(torch, deepspeed, cfg, ds_config, stage, device="cuda"):
    """LlamaForCausalLM (attn_implementation sdpa) in bf16 straight on the GPU (no fp32 or host copy first). Stage 3
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
        with torch.device(device):
            model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(f"model built in {seconds:.1f} s", file=sys.stderr)
    return model, seconds


def set_checkpointing(model, on):
    """transformers' gradient checkpointing (every layer, non-reentrant) on or off for the next
    phase, checked on the model."""
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    if model.is_gradient_checkpointing != on:
        raise RuntimeError(f"transformers did not turn gradient checkpointing {'on' if on else 'off'}")


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


def init_distributed(deepspeed, device):
    """One rank, without the `deepspeed` launcher: its environment, unless already set."""
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")


def host_rss_bytes():
    try:
        import psutil
    except ImportError:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return None
    return psutil.Process().memory_info().rss


def host_memory_stats(torch):
    """torch.cuda.host_memory_stats(): torch's pinned allocator (what --pinned torch rounds)."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "host_memory_stats"):
        return None
    stats = torch.cuda.host_memory_stats()
    return {k: v for k, v in stats.items() if isinstance(v, (int, float))
            and any(w in k for w in ("allocated_bytes", "reserved_bytes", "allocations",
                                     "active_bytes", "num_host_alloc", "segment"))
            and ("current" in k or "peak" in k or k.startswith("num_"))}


class Clock:
    """Phase times to the device's completion."""

    def __init__(self, torch, device):
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def now(self):
        self.sync()
        return time.perf_counter()


def sdpa_context(torch, device):
    """Every attention of the step on SDPA's flash kernel (an error, not a silent fallback,
    where it cannot run): the Hugging Face model was built with attn_implementation sdpa."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def make_schedule(torch, optimizer, args, total_steps, lr):
    """tandem's WarmupCosineLR as a torch LambdaLR over DeepSpeed's optimizer; Twin-Flow's
    GPU-side torch AdamW (backup_optimizer) keeps its own first group, so its learning rate is
    set beside (ZeRO-3's step gives that group only the parameters, not the rate)."""
    factor = (lambda s: lr_at(s, 1.0, args.lr_warmup_steps, total_steps, args.cos_min_ratio))
    # The ZeRO optimizer wraps a torch Optimizer (CPU Adam, AdamW) whose param_groups it shares.
    inner = getattr(optimizer, "optimizer", optimizer)
    for group in inner.param_groups:
        group["lr"] = lr
        group.pop("initial_lr", None)
    schedule = torch.optim.lr_scheduler.LambdaLR(inner, factor)

    def sync_backup():
        backup = getattr(optimizer, "backup_optimizer", None)
        if backup is not None:
            for group in backup.param_groups:
                group["lr"] = optimizer.param_groups[0]["lr"]
    sync_backup()
    return schedule, sync_backup


def run_step(torch, engine, batch, vocab_size, step, accumulation, clock, device):
    """One optimizer step of `accumulation` micro-batches: forward, backward (each summed over
    micro-batches) and the update (the boundary's engine.step()), in seconds; the loss is the
    micro-batches' mean."""
    forward = backward = update = 0.0
    losses = []
    with sdpa_context(torch, device):
        for micro in range(accumulation):
            x, y = batch(step * accumulation + micro)
            # Set, not counted: DeepSpeed's own count (micro_steps % accumulation) runs on across
            # phases, and would put the next phase's boundaries mid-step where its accumulation
            # does not divide the micro-batches run before.
            engine.set_gradient_accumulation_boundary(micro == accumulation - 1)
            t0 = clock.now()
            logits = engine(input_ids=x).logits
            # fp32 cross-entropy over the bf16 logits, as the PyTorch baseline computes it
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab_size),
                                                     y.view(-1))
            del logits
            t1 = clock.now()
            engine.backward(loss)  # scaled by 1 / accumulation inside DeepSpeed
            t2 = clock.now()
            engine.step()  # at the boundary: clipping, the update, bf16 weights back
            t3 = clock.now()
            forward, backward = forward + t1 - t0, backward + t2 - t1
            if micro == accumulation - 1:
                update = t3 - t2
            else:
                backward += t3 - t2
            losses.append(loss.item())
    return (forward, backward, update), sum(losses) / len(losses)


def find_largest_micro_batch(torch, engine, batch_for, vocab_size, clock, args, device):
    """Micro-batches 1, 2, 4, ... (up to the largest train batch) on the built engine, one
    optimizer step each at accumulation 1, until one runs out of GPU memory. Returns
    [(micro-batch, peak bytes or None, ms or error)]."""
    tried = []
    micro, limit = 1, max(args.train_batch_sizes)
    while micro <= limit:
        engine.set_train_micro_batch_size(micro)
        engine.set_train_batch_size(micro)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            times, _ = run_step(torch, engine, batch_for(micro), vocab_size, 0, 1, clock, device)
        except torch.OutOfMemoryError as e:
            tried.append({"micro_batch": micro, "error": str(e).splitlines()[0][:200]})
            print(f"micro-batch {micro}: out of GPU memory", file=sys.stderr)
            break
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
        tried.append({"micro_batch": micro, "peak_gpu_bytes": peak,
                      "ms": round(sum(times) * 1e3, 1)})
        print(f"micro-batch {micro}: {sum(times) * 1e3:.0f} ms, peak "
              f"{(peak or 0) / 2**30:.2f} GiB", file=sys.stderr)
        micro *= 2
    return tried


def median_ms(values):
    return round(statistics.median(values) * 1e3, 3) if values else None


def main():
    args = parse_args()
    config = load_config(args.config)
    check_args(args, config)
    lr = base_lr(args, config)
    first_tbs = next((p["train_batch_size"] for p in args.phases if "not_run" not in p),
                     args.train_batch_sizes[0])
    if args.print_ds_config:
        print(json.dumps(deepspeed_config(args, config, first_tbs), indent=2))
        return
    if args.print_plan:
        print(json.dumps({"mode": args.mode,
                          "offload_ratio": deepspeed_memory.offloaded_share(args.mode,
                                                                            args.offload_ratio),
                          "why": args.plan_why, "phases": args.phases}))
        return
    if args.print_lr_schedule:
        total = args.warmup + args.steps
        print(json.dumps([lr_at(s, lr, args.lr_warmup_steps, total, args.cos_min_ratio)
                          for s in range(total)]))
        return
    if args.best:
        log_best_plan(args)
    else:
        check_host_memory(args, config)
    if not args.find_largest_micro_batch and all("not_run" in p for p in args.phases):
        print_phases_not_run(args, config)  # without building the model
        return

    cores = bind_cores(args)
    if args.device == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
        alloc_conf, alloc_why = None, "cpu device"
    else:
        import_torch(args.device)  # says "no GPU" before the child probe
        alloc_conf, alloc_why = check_alloc_conf(args.alloc_conf)
    torch = import_torch(args.device)
    result = stdout_for_the_result()
    deepspeed = import_deepspeed()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pytorch_gpt2_train import batch_maker
    from pytorch_llama_train import llama_config
    from deepspeed.accelerator import get_accelerator

    init_distributed(deepspeed, args.device)
    pinning = ExactPinning(torch, get_accelerator()) if args.pinned == "exact" else None
    cpu_adam_s = build_cpu_adam() if args.offload else 0.0
    torch.manual_seed(int(config.get("train", {}).get("seed", 1337)))
    cfg = llama_config(config["model"])
    ds_config = deepspeed_config(args, config, first_tbs)
    model, construct_s = build_model(torch, deepspeed, cfg, ds_config, args.stage,
                                     args.device)
    attn = getattr(model.config, "_attn_implementation", None)
    if attn != "sdpa":
        raise RuntimeError(f"the Hugging Face model's attention is {attn!r}, not sdpa")
    params = parameter_count(model)
    engine, optimizer, _, _ = deepspeed.initialize(model=model,
                                                   model_parameters=parameter_groups(model),
                                                   config=ds_config)
    print(f"engine ready: {type(optimizer).__name__} over {type(optimizer.optimizer).__name__}, "
          f"{params:,} parameters, mode {args.mode}, threads {os.environ.get('OMP_NUM_THREADS')}",
          file=sys.stderr)
    T, vocab = args.seq_len, cfg.vocab_size
    dev = torch.device(args.device)
    clock = Clock(torch, args.device)
    common = {
        "framework": "deepspeed", "deepspeed": deepspeed.__version__, "torch": torch.__version__,
        "mode": args.mode, "zero_stage": args.stage, "offload": "cpu" if args.offload else "none",
        "offload_ratio": args.offload_ratio if args.mode == "zero3-twinflow" else
        (1.0 if args.offload else 0.0),
        "pinned": args.pinned, "alloc_conf": alloc_conf, "alloc_conf_check": alloc_why,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cores": len(cores) if cores else None,
        "reduce_bucket_size": int(args.reduce_bucket_size),
        "sub_group_size": int(args.sub_group_size) if args.stage == 3 else None,
        "params": params, "seq_len": T, "data": args.data or "random tokens",
        "attn_implementation": attn, "sdpa_backend": "flash",
        "cpu_adam_build_s": round(cpu_adam_s, 3), "construct_s": round(construct_s, 3),
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "config": args.config, "device": args.device}

    if args.find_largest_micro_batch:
        set_checkpointing(engine.module, args.phases[0]["activation_checkpointing"])
        tried = find_largest_micro_batch(
            torch, engine, lambda m: batch_maker(args.data, vocab, m, T, dev), vocab, clock,
            args, args.device)
        ran = [t["micro_batch"] for t in tried if "error" not in t]
        print(json.dumps(dict(common, probe="largest_micro_batch", tried=tried,
                              largest_micro_batch=max(ran) if ran else 0)),
              file=result, flush=True)
        return

    for phase, setting in enumerate(args.phases):
        tbs, micro = setting["train_batch_size"], setting["micro_batch"]
        accumulation = setting["gradient_accumulation_steps"]
        planned = {k: setting[k] for k in ("host_bytes", "gpu_bytes") if k in setting}
        about = dict(common, phase=phase + 1, train_batch_size=tbs, micro_batch=micro,
                     batch=micro, gradient_accumulation_steps=accumulation,
                     activation_checkpointing=setting["activation_checkpointing"],
                     tokens_per_step=tbs * T, **{f"planned_{k}": v for k, v in planned.items()})
        if "not_run" in setting:
            print(json.dumps(dict(about, not_run=setting["not_run"])), file=result, flush=True)
            continue
        engine.set_train_micro_batch_size(micro)
        engine.set_train_batch_size(tbs)
        set_checkpointing(engine.module, setting["activation_checkpointing"])
        batch = batch_maker(args.data, vocab, micro, T, dev)
        total = args.warmup + args.steps
        schedule, sync_backup = make_schedule(torch, optimizer, args, total, lr)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, losses, lrs = [], [], []
        after_first = {}
        tokens_per_step = tbs * T
        for step in range(total):
            lrs.append(optimizer.param_groups[0]["lr"])
            split, loss = run_step(torch, engine, batch, vocab, step, accumulation, clock,
                                   args.device)
            schedule.step()
            sync_backup()
            if step >= args.warmup:
                times.append(split)
            losses.append(loss)
            if step == 0:
                after_first = {"host_rss_bytes_after_first_step": host_rss_bytes(),
                               "host_memory_stats_after_first_step": host_memory_stats(torch)}
            elapsed = sum(split)
            print(f"phase {phase + 1} step {step + 1}: loss {loss:.4f}, lr {lrs[-1]:.3g}, "
                  f"{elapsed * 1e3:.1f} ms (forward {split[0] * 1e3:.1f}, backward "
                  f"{split[1] * 1e3:.1f}, update {split[2] * 1e3:.1f}), "
                  f"{tokens_per_step / elapsed:.0f} tok/s", file=sys.stderr)
        pinned, host_tensors = host_tensor_bytes(torch, optimizer)
        print(json.dumps(dict(
            about, timed_steps=args.steps, warmup_steps=args.warmup,
            lr_schedule={"type": "WarmupCosineLR", "lr": lr,
                         "warmup_num_steps": args.lr_warmup_steps,
                         "cos_min_ratio": args.cos_min_ratio, "total_steps": total},
            tokens_per_s=statistics.median([tokens_per_step / sum(t) for t in times]),
            ms=median_ms([sum(t) for t in times]),
            forward_ms=median_ms([t[0] for t in times]),
            backward_ms=median_ms([t[1] for t in times]),
            update_ms=median_ms([t[2] for t in times]),
            peak_gpu_bytes=torch.cuda.max_memory_allocated() if args.device == "cuda" else None,
            peak_gpu_reserved_bytes=(torch.cuda.max_memory_reserved()
                                     if args.device == "cuda" else None),
            pinned_host_bytes=pinned, optimizer_host_bytes=host_tensors,
            exact_pinned_bytes=pinning.peak if pinning else None,
            host_rss_bytes=host_rss_bytes(), host_memory_stats=host_memory_stats(torch),
            losses=[round(v, 4) for v in losses], lrs=[float("%.6g" % v) for v in lrs],
            **after_first)), file=result, flush=True)


if __name__ == "__main__":
    main()
