"""What DeepSpeed 0.19's modes need of a machine's host and GPU memory to train a Llama, and the
setting a fair tuner gives DeepSpeed for each train batch on that machine (the `best` mode of
bench/deepspeed_offload_train.py and bench/gpu_offload_sweep.sh).

Estimates, in bytes, each term read from DeepSpeed 0.19.8's code (deepspeed/runtime/zero/
stage_1_and_2.py and stage3.py) or fitted to a measurement, as said beside it. N is the
parameter count, R the share of the optimizer state offloaded (1 for ZeRO-Offload and ZeRO-3
offload, offload_optimizer.ratio for Twin-Flow).

Host memory, all of it allocated once and held:
  ZeRO-Offload (zero2-offload):
    fp32 master partition (single_partition_of_fp32_groups), pinned   4 N
    its fp32 .grad, pinned                                            4 N
    the bf16 copy staged for the GPU (param_buffer_of_bit16_...)      2 N
    DeepSpeedCPUAdam's exp_avg and exp_avg_sq, fp32                   8 N
    with gradient accumulation: accumulated_grads_in_cpu, one buffer
      of the parameter's dtype (bf16) per parameter, pinned, made on
      the first micro-batch that is not an optimizer step             2 N
    temp_grad_buffer_for_cpu_offload: the largest parameter, bf16, pinned
  ZeRO-3 with the optimizer offloaded (zero3-offload, zero3-twinflow):
    grad_partitions_flat_buffer: every gradient, fp32, pinned (where
      accumulation adds too, so it costs no more memory)              4 N
    the offloaded subgroups' fp32 master weights, fp32 gradients
      (pinned) and CPU Adam's moments                            16 R N
  every mode: the process (torch, the CUDA context, transformers)    2 GB
The 2 GB is what is left of the 3B run of 2026-11-26 (69.5 GB resident) after its buffers,
each rounded up to a power of two by torch's pinned allocator. So the 7B shape (6.74 B) needs
115 GiB in ZeRO-Offload at accumulation 1 and 128 GiB with accumulation: on a machine of
126 GiB, DeepSpeed trains it one micro-batch per step.

GPU memory:
  ZeRO-2 without offload: bf16 weights and gradients, fp32 master weights, gradients and
    Adam moments                                                     20 N
  the offload modes: bf16 weights                                     2 N
    and the fp32 master weights, gradients and torch AdamW's moments of the subgroups kept
    on the GPU                                                 16 (1 - R) N
    (ZeRO-3 on one GPU with every parameter persistent holds nothing more: its 3B offload run
    of 2026-11-26 peaked at 38.24 GiB against ZeRO-Offload's 37.49)
  every mode: the two reduce buckets of overlap_comm (2 x reduce_bucket_size bf16 elements) and
    the largest parameter in bf16 (temp_grad_buffer_for_gpu_offload)
  per token of the micro-batch:
    the logits: bf16, their fp32 copy for the loss, its gradient and the bf16 gradient  12 V
    without activation checkpointing, every layer's saved activations  L x W
    with it, every layer's input (bf16) and one layer's activations    L x 2 C + W
  W = 11.2 (C + I) bytes per token and layer: fitted to the 3B run of 2026-11-26 (ZeRO-Offload,
  micro-batch 4, sequence 2048, flash SDPA, no checkpointing: 37.49 GiB peak), the only
  measurement there is; every run records its peak (peak_gpu_bytes) beside the estimate.

The best setting (plan_best), for each train batch of TBS sequences:
  mode: ZeRO-2 without offload where its state and one checkpointed sequence fit the GPU; else
    ZeRO-Offload where its state fits the host (the faster of DeepSpeed's full offloads on
    2026-11-26: 3B at 4,852 tokens/s against ZeRO-3 offload's 2,719); else Twin-Flow
    (ZeRO-3 with offload_optimizer.ratio R, one R for the whole run since DeepSpeed fixes it at
    the start): the R, in steps of RATIO_STEP, that lets the most train batches run, the
    smallest of those (the more of the update on the GPU, the faster);
  micro-batch: the whole train batch where it fits the GPU without checkpointing; else, in
    ZeRO-2 without offload, accumulation over the largest micro-batch that fits (accumulating
    on the GPU costs next to nothing); else one checkpointed micro-batch of the whole train
    batch; else accumulation over the largest micro-batch that fits, checkpointed where that
    makes it larger (offloaded, every micro-batch moves every gradient to the host and back,
    in ZeRO-Offload's accumulated_grads_in_cpu or ZeRO-3's grad_partitions_flat_buffer, while
    recompute costs about a third of a forward and backward), where the host holds what
    accumulation adds; else the phase is not run, and says why.
A plan counts a GPU as usable up to GPU_SHARE of the memory it is given, because W rests on one
measurement and the allocator fragments, and the host up to HOST_SHARE of its available memory.
"""

GIB = 1 << 30
GPU_SHARE = 0.9
HOST_SHARE = 0.97
PROCESS_HOST_BYTES = 2 * 10**9
LAYER_BYTES_PER_TOKEN_PER_WIDTH = 11.2
LOGIT_BYTES_PER_TOKEN_PER_VOCAB = 12
RATIO_STEP = 0.05
MODES = ("zero2", "zero2-offload", "zero3-offload", "zero3-twinflow")


def llama_shape(model):
    """{"params", "layers", "hidden", "intermediate", "vocab", "largest"} of a tandem config's
    "model" section (Hugging Face's LlamaConfig names); largest is the largest parameter's
    element count."""
    C, L = model["hidden_size"], model["num_hidden_layers"]
    V, I = model["vocab_size"], model["intermediate_size"]
    H = model["num_attention_heads"]
    KV = model.get("num_key_value_heads") or H
    D = model.get("head_dim") or C // H
    tied = bool(model.get("tie_word_embeddings"))
    per_layer = C * H * D + 2 * C * KV * D + H * D * C + 3 * C * I + 2 * C
    params = V * C * (1 if tied else 2) + C + L * per_layer
    return {"params": params, "layers": L, "hidden": C, "intermediate": I, "vocab": V,
            "largest": max(V * C, C * I, C * H * D)}


def offloaded_share(mode, offload_ratio):
    """R: the share of the optimizer state on the host."""
    return {"zero2": 0.0, "zero2-offload": 1.0, "zero3-offload": 1.0}.get(mode, offload_ratio)


def host_bytes(mode, shape, accumulates, offload_ratio=1.0):
    """Host memory of `mode` over the run (see the module's table)."""
    n = shape["params"]
    if mode == "zero2":
        state = 0
    elif mode == "zero2-offload":
        state = (4 + 4 + 2 + 8 + (2 if accumulates else 0)) * n + 2 * shape["largest"]
    else:
        state = int((4 + 16 * offloaded_share(mode, offload_ratio)) * n)
    return state + PROCESS_HOST_BYTES


def gpu_bytes(mode, shape, tokens, checkpointing, reduce_bucket_size=5e8, offload_ratio=1.0):
    """GPU memory of `mode` at a micro-batch of `tokens` tokens (see the module's table)."""
    n, L, C = shape["params"], shape["layers"], shape["hidden"]
    state = 20 * n if mode == "zero2" else int(
        (2 + 16 * (1 - offloaded_share(mode, offload_ratio))) * n)
    fixed = state + 2 * 2 * int(reduce_bucket_size) + 2 * shape["largest"]
    layer = LAYER_BYTES_PER_TOKEN_PER_WIDTH * (C + shape["intermediate"])
    per_token = LOGIT_BYTES_PER_TOKEN_PER_VOCAB * shape["vocab"] + (
        L * 2 * C + layer if checkpointing else L * layer)
    return int(fixed + tokens * per_token)


def plan_phases(mode, shape, train_batch_sizes, seq, gpu_memory_bytes, host_memory_bytes,
                reduce_bucket_size=5e8, micro_without_checkpointing=None, offload_ratio=1.0):
    """Each train batch's micro-batch, accumulation and checkpointing in `mode` (the module's
    rule), or "not_run" with the reason; see plan_best."""
    gpu_limit = GPU_SHARE * gpu_memory_bytes
    host_limit = HOST_SHARE * host_memory_bytes
    host_once = host_bytes(mode, shape, False, offload_ratio)
    host_accumulating = host_bytes(mode, shape, True, offload_ratio)
    accumulation_fits = host_accumulating <= host_limit

    def gpu(micro, checkpointing):
        return gpu_bytes(mode, shape, micro * seq, checkpointing, reduce_bucket_size,
                         offload_ratio)

    phases = []
    for tbs in train_batch_sizes:
        divisors = [m for m in range(1, tbs + 1) if tbs % m == 0]
        plain = max((m for m in divisors if gpu(m, False) <= gpu_limit), default=0)
        if micro_without_checkpointing is not None:
            plain = max((m for m in divisors if m <= micro_without_checkpointing), default=0)
        checkpointed = max((m for m in divisors if gpu(m, True) <= gpu_limit), default=0)

        def setting(micro, checkpointing):
            return {"train_batch_size": tbs, "micro_batch": micro,
                    "gradient_accumulation_steps": tbs // micro,
                    "activation_checkpointing": checkpointing,
                    "host_bytes": host_accumulating if micro < tbs else host_once,
                    "gpu_bytes": gpu(micro, checkpointing)}
        if host_once > host_limit:
            phase = setting(plain or max(checkpointed, 1), not plain)
            phase["not_run"] = (
                f"{mode} needs about {host_once / GIB:.1f} GiB of host memory even without "
                f"accumulation, more than {HOST_SHARE:g} of the {host_memory_bytes / GIB:.1f} GiB "
                "available")
        elif plain == tbs:
            phase = setting(tbs, False)
        elif mode == "zero2" and plain:
            phase = setting(plain, False)  # accumulation on the GPU costs next to nothing
        elif checkpointed == tbs:
            phase = setting(tbs, True)
        elif max(plain, checkpointed) and accumulation_fits:
            # Offloaded, each micro-batch moves every gradient to the host and back: fewer,
            # larger micro-batches, with recompute where that is what makes them larger.
            micro = max(plain, checkpointed)
            phase = setting(micro, micro > plain)
        else:
            phase = setting(max(checkpointed, 1), True)
            if phase["gpu_bytes"] > gpu_limit:
                phase["not_run"] = (
                    f"{mode} with one checkpointed sequence needs about "
                    f"{phase['gpu_bytes'] / GIB:.1f} GiB of GPU memory, more than {GPU_SHARE:g} "
                    f"of the {gpu_memory_bytes / GIB:.1f} GiB there are")
            else:
                phase["not_run"] = (
                    f"{tbs} sequences need accumulation (the largest checkpointed micro-batch "
                    f"that fits the GPU is {checkpointed}), and {mode} with accumulation needs "
                    f"about {host_accumulating / GIB:.1f} GiB of host memory, more than "
                    f"{HOST_SHARE:g} of the {host_memory_bytes / GIB:.1f} GiB available")
        phases.append(phase)
    return phases


def plan_best(shape, train_batch_sizes, seq, gpu_memory_bytes, host_memory_bytes,
              reduce_bucket_size=5e8, micro_without_checkpointing=None):
    """(mode, offload_ratio, phases, why): DeepSpeed's best setting for each train batch on a
    machine with gpu_memory_bytes of GPU memory and host_memory_bytes of host memory available
    (the module's rule). Each phase: {"train_batch_size", "micro_batch",
    "gradient_accumulation_steps", "activation_checkpointing", "host_bytes", "gpu_bytes"}, and
    "not_run" (why) where nothing fits; a phase not run still names the setting it would need.
    micro_without_checkpointing: the largest micro-batch known to fit without checkpointing (a
    probe's answer), instead of the estimate."""
    args = (shape, train_batch_sizes, seq, gpu_memory_bytes, host_memory_bytes,
            reduce_bucket_size, micro_without_checkpointing)
    zero2 = gpu_bytes("zero2", shape, seq, True, reduce_bucket_size)
    if zero2 <= GPU_SHARE * gpu_memory_bytes:
        return "zero2", 0.0, plan_phases("zero2", *args), (
            f"zero2: ZeRO-2's state and one checkpointed sequence ({zero2 / GIB:.1f} GiB) fit "
            f"{GPU_SHARE:g} of the GPU's {gpu_memory_bytes / GIB:.1f} GiB")
    why = (f"ZeRO-2's state and one checkpointed sequence ({zero2 / GIB:.1f} GiB) do not fit "
           f"{GPU_SHARE:g} of the GPU's {gpu_memory_bytes / GIB:.1f} GiB")
    steps = round(1 / RATIO_STEP)
    candidates = [("zero2-offload", 1.0)] + [("zero3-twinflow", r / steps)
                                             for r in range(1, steps + 1)]
    plans = [(mode, ratio, plan_phases(mode, *args, offload_ratio=ratio))
             for mode, ratio in candidates]
    runs = [sum("not_run" not in p for p in phases) for _, _, phases in plans]
    if max(runs) == 0:
        return (*plans[0], f"zero2-offload: {why}, and neither ZeRO-Offload nor Twin-Flow at any "
                "ratio fits this machine (each phase says why ZeRO-Offload does not)")
    if runs[0] == max(runs):
        return (*plans[0], f"zero2-offload: {why}")

    def micro_steps(phases):
        return sum(p["gradient_accumulation_steps"] for p in phases if "not_run" not in p)
    # Twin-Flow: of the ratios that run the most train batches, the one with the fewest
    # micro-batches (ZeRO-3 moves every gradient to the host and back on each), then the
    # smallest share on the host.
    mode, ratio, phases = min((plan for plan, n in zip(plans, runs) if n == max(runs)),
                              key=lambda plan: (micro_steps(plan[2]), plan[1]))
    return mode, ratio, phases, (
        f"zero3-twinflow at ratio {ratio:g}: {why}; ZeRO-Offload runs {runs[0]} of the "
        f"{len(phases)} train batches here and Twin-Flow {max(runs)}, with the fewest "
        f"micro-batches ({micro_steps(phases)}) at {ratio:g}")


def available_host_bytes(meminfo="/proc/meminfo"):
    """MemAvailable of /proc/meminfo in bytes, or None where it cannot be read."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
