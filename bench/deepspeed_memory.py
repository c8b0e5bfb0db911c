"""What DeepSpeed 0.19's modes need of a machine's host and GPU memory to train a Llama, and the
setting a fair tuner gives DeepSpeed for each train batch on that machine (the `best` mode of
bench/deepspeed_offload_train.py and bench/gpu_offload_sweep.sh).

Estimates, in bytes, each term read from DeepSpeed 0.19.8's code (deepspeed/runtime/zero/
stage_1_and_2.py) or fitted to a measurement, as said beside it. N is the parameter count.

Host memory of ZeRO-Offload (zero2-offload), all of it allocated once and held:
  fp32 master partition (single_partition_of_fp32_groups), pinned     4 N
  its fp32 .grad, pinned                                              4 N
  the bf16 copy staged for the GPU (param_buffer_of_bit16_...)        2 N
  DeepSpeedCPUAdam's exp_avg and exp_avg_sq, fp32                     8 N
  with gradient accumulation: accumulated_grads_in_cpu, one buffer
    of the parameter's dtype (bf16) per parameter, pinned, made on
    the first micro-batch that is not an optimizer step               2 N
  temp_grad_buffer_for_cpu_offload: the largest parameter, bf16, pinned
  the process (torch, the CUDA context, transformers)                 2 GB
The 2 GB is what is left of the 3B run of 2026-11-26 (69.5 GB resident) after its buffers,
each rounded up to a power of two by torch's pinned allocator. So the 7B shape (6.74 B) needs
115 GiB at accumulation 1 and 128 GiB with accumulation: on a machine of 126 GiB, DeepSpeed
trains it only one micro-batch per step. ZeRO-2 without offload holds nothing on the host but
the process; the ZeRO-3 modes are not modelled (None).

GPU memory:
  ZeRO-2 without offload: bf16 weights and gradients, fp32 master weights, gradients and
    Adam moments                                                     20 N
  ZeRO-Offload: bf16 weights                                          2 N
  both: the two reduce buckets of overlap_comm (2 x reduce_bucket_size bf16 elements) and
    temp_grad_buffer_for_gpu_offload (the largest parameter, bf16)
  per token of the micro-batch:
    the logits: bf16, their fp32 copy for the loss, its gradient and the bf16 gradient  12 V
    without activation checkpointing, every layer's saved activations  L x W
    with it, every layer's input (bf16) and one layer's activations    L x 2 C + W
  W = 11.2 (C + I) bytes per token and layer: fitted to the 3B run of 2026-11-26 (ZeRO-Offload,
  micro-batch 4, sequence 2048, flash SDPA, no checkpointing: 37.49 GiB peak), the only
  measurement there is; every run records its peak (peak_gpu_bytes) to check it against.

The best setting (plan_best), for each train batch of TBS sequences:
  mode: ZeRO-2 without offload where its state and one checkpointed sequence fit the GPU, else
    ZeRO-Offload (the faster of DeepSpeed's offload modes on 2026-11-26: 3B at 4,852 tokens/s
    against ZeRO-3 offload's 2,719);
  micro-batch: the whole train batch where it fits the GPU without checkpointing; else
    accumulation over the largest micro-batch that fits (DeepSpeed's usual recipe), where the
    host holds what accumulation adds; else one checkpointed micro-batch of the whole train
    batch; else the largest checkpointed micro-batch with accumulation, where the host holds
    it; else the phase is not run, and says why.
A plan counts a GPU as usable up to GPU_SHARE of the memory it is given, because W rests on one
measurement and the allocator fragments.
"""

GIB = 1 << 30
GPU_SHARE = 0.9
PROCESS_HOST_BYTES = 2 * 10**9
LAYER_BYTES_PER_TOKEN_PER_WIDTH = 11.2
LOGIT_BYTES_PER_TOKEN_PER_VOCAB = 12
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


def host_bytes(mode, shape, accumulates):
    """Host memory of `mode` over the run (see the module's table), or None where it is not
    modelled (the ZeRO-3 modes)."""
    n = shape["params"]
    if mode == "zero2":
        return PROCESS_HOST_BYTES
    if mode == "zero2-offload":
        return ((4 + 4 + 2 + 8 + (2 if accumulates else 0)) * n + 2 * shape["largest"]
                + PROCESS_HOST_BYTES)
    return None


def gpu_bytes(mode, shape, tokens, checkpointing, reduce_bucket_size=5e8):
    """GPU memory of `mode` at a micro-batch of `tokens` tokens (see the module's table)."""
    n, L, C = shape["params"], shape["layers"], shape["hidden"]
    state = 20 * n if mode == "zero2" else 2 * n
    fixed = state + 2 * 2 * int(reduce_bucket_size) + 2 * shape["largest"]
    layer = LAYER_BYTES_PER_TOKEN_PER_WIDTH * (C + shape["intermediate"])
    per_token = LOGIT_BYTES_PER_TOKEN_PER_VOCAB * shape["vocab"] + (
        L * 2 * C + layer if checkpointing else L * layer)
    return int(fixed + tokens * per_token)


def largest_micro_batch(mode, shape, seq, train_batch, gpu_limit, checkpointing,
                        reduce_bucket_size=5e8):
    """The largest divisor of train_batch whose micro-batch fits gpu_limit bytes; 0 if none."""
    fits = [m for m in range(1, train_batch + 1) if train_batch % m == 0 and
            gpu_bytes(mode, shape, m * seq, checkpointing, reduce_bucket_size) <= gpu_limit]
    return max(fits, default=0)


def plan_best(shape, train_batch_sizes, seq, gpu_memory_bytes, host_memory_bytes,
              reduce_bucket_size=5e8, micro_without_checkpointing=None):
    """(mode, phases, why): DeepSpeed's best setting for each train batch on a machine with
    gpu_memory_bytes of GPU memory and host_memory_bytes of host memory available (see the
    module's text). Each phase: {"train_batch_size", "micro_batch",
    "gradient_accumulation_steps", "activation_checkpointing", "host_bytes", "gpu_bytes"},
    and "not_run" (why) where no setting fits; a phase that is not run still names the setting
    DeepSpeed would need. micro_without_checkpointing: the largest micro-batch known to fit
    without checkpointing (a probe's answer), instead of the estimate."""
    gpu_limit = GPU_SHARE * gpu_memory_bytes
    zero2_fits = gpu_bytes("zero2", shape, seq, True, reduce_bucket_size) <= gpu_limit
    mode = "zero2" if zero2_fits else "zero2-offload"
    why = (f"{mode}: ZeRO-2's state and one checkpointed sequence "
           f"({gpu_bytes('zero2', shape, seq, True, reduce_bucket_size) / GIB:.1f} GiB) "
           f"{'fit' if zero2_fits else 'do not fit'} {GPU_SHARE:g} of the GPU's "
           f"{gpu_memory_bytes / GIB:.1f} GiB")
    host_once = host_bytes(mode, shape, False) or 0
    host_accumulating = host_bytes(mode, shape, True) or 0
    accumulation_fits = host_accumulating <= host_memory_bytes
    phases = []
    for tbs in train_batch_sizes:
        def setting(micro, checkpointing):
            return {"train_batch_size": tbs, "micro_batch": micro,
                    "gradient_accumulation_steps": tbs // micro,
                    "activation_checkpointing": checkpointing,
                    "host_bytes": host_bytes(mode, shape, micro < tbs),
                    "gpu_bytes": gpu_bytes(mode, shape, micro * seq, checkpointing,
                                           reduce_bucket_size)}
        plain = largest_micro_batch(mode, shape, seq, tbs, gpu_limit, False, reduce_bucket_size)
        if micro_without_checkpointing is not None:
            plain = max((m for m in range(1, min(tbs, micro_without_checkpointing) + 1)
                         if tbs % m == 0), default=0)
        checkpointed = largest_micro_batch(mode, shape, seq, tbs, gpu_limit, True,
                                           reduce_bucket_size)
        if host_once > host_memory_bytes:
            phase = setting(plain or max(checkpointed, 1), not plain)
            phase["not_run"] = (
                f"{mode} needs about {host_once / GIB:.1f} GiB of host "
                f"memory even without accumulation, more than the {host_memory_bytes / GIB:.1f} GiB "
                "available (the ZeRO-3 modes are not estimated: try zero3-offload)")
        elif plain == tbs:
            phase = setting(tbs, False)
        elif plain and accumulation_fits:
            phase = setting(plain, False)
        elif checkpointed == tbs:
            phase = setting(tbs, True)
        elif checkpointed and accumulation_fits:
            phase = setting(checkpointed, True)
        else:
            phase = setting(max(checkpointed, 1), True)
            if phase["gpu_bytes"] > gpu_limit:
                phase["not_run"] = (
                    f"{mode} with one checkpointed sequence needs about {phase['gpu_bytes'] / GIB:.1f} GiB "
                    f"of GPU memory, more than {GPU_SHARE:g} of the "
                    f"{gpu_memory_bytes / GIB:.1f} GiB there are")
            else:
                phase["not_run"] = (
                    f"{tbs} sequences need accumulation (the largest checkpointed micro-batch "
                    f"that fits the GPU is {checkpointed}), and {mode} with accumulation needs "
                    f"about {host_accumulating / GIB:.1f} GiB of host memory, more "
                    f"than the {host_memory_bytes / GIB:.1f} GiB available")
        phases.append(phase)
    return mode, phases, why


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
