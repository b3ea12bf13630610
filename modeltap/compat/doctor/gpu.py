"""The rule on small GPUs (small-gpu): on 24 GB or less, training fits only with bf16 optimizer state,
weights loaded on the CPU and a CUDA allocator with expandable segments.

Owns: that rule. Does not own: finding out the GPU's memory (the caller's `gpu_memory_gb`), the
micro-batch size (limits.py).
"""

from __future__ import annotations

import shlex

from modeltap.compat.doctor.context import Context, Finding, override

# The GPU size at and below which the memory-saving settings decide whether training fits.
SMALL_GPU_GB = 24.0
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def small_gpu(ctx: Context) -> list[Finding]:
    """Memory-saving settings for GPUs of 24 GB or less.

    Without them training runs out of memory (the fields' help in AReaL's areal/api/cli_args.py:
    TrainEngineConfig.optimizer_dtype, FSDPEngineConfig.memory_efficient_load)."""
    if ctx.gpu_memory_gb is None:
        title = "GPU memory unknown: the small-GPU settings were not checked"
        why = (
            f"GPUs of {SMALL_GPU_GB:g} GB or less need memory-saving settings; the GPU's size was not given."
        )
        return [Finding("info", "actor", title, why, "modeltap doctor --gpu-memory-gb N ...")]
    if ctx.gpu_memory_gb > SMALL_GPU_GB:
        return []
    gpu = f"On a {ctx.gpu_memory_gb:g} GB GPU"
    findings = []
    backend = str(ctx.config.get("actor.backend") or "fsdp")
    if backend.startswith("fsdp"):  # Megatron and Archon ignore both FSDP settings
        findings.extend(_optimizer_dtype(ctx, gpu))
        findings.extend(_memory_efficient_load(ctx, gpu))
    findings.extend(_alloc_conf(ctx, gpu))
    return findings


def _optimizer_dtype(ctx: Context, gpu: str) -> list[Finding]:
    dtype = ctx.config.get("actor.optimizer_dtype", "float32")
    if dtype in ("bfloat16", "bf16"):
        return []
    why = (
        f"{gpu}, fp32 master weights and Adam state (optimizer_dtype {dtype}) take 12 bytes a "
        "parameter: 'bfloat16' with optimizer.type 'adam_bf16' halves that (cli_args.py "
        "TrainEngineConfig.optimizer_dtype)."
    )
    fix = " ".join(
        [override("actor.optimizer_dtype", "bfloat16"), override("actor.optimizer.type", "adam_bf16")]
    )
    return [Finding("warning", "actor.optimizer_dtype", "optimizer state in fp32", why, fix)]


def _memory_efficient_load(ctx: Context, gpu: str) -> list[Finding]:
    path = "actor.fsdp.memory_efficient_load"
    if ctx.config.get(path) is True or ctx.config.get("actor.init_from_scratch") is True:
        return []
    why = (
        f"{gpu}, every rank loading the full checkpoint onto the GPU before sharding can run out "
        "of memory at start-up; memory_efficient_load loads on CPU and broadcasts after sharding "
        "(cli_args.py FSDPEngineConfig)."
    )
    return [Finding("warning", path, "weights load onto every GPU at once", why, override(path, True))]


def _alloc_conf(ctx: Context, gpu: str) -> list[Finding]:
    """PYTORCH_CUDA_ALLOC_CONF, from the environment or from actor.scheduling_spec[i].env_vars."""
    name = "PYTORCH_CUDA_ALLOC_CONF"
    paths = [
        f"actor.scheduling_spec.{i}.env_vars.{name}" for i in range(ctx.config.size("actor.scheduling_spec"))
    ]
    values = [ctx.env.get(name)] + [ctx.config.get(p) for p in paths]
    if any(EXPANDABLE_SEGMENTS in [o.strip() for o in str(v).split(",")] for v in values if v):
        return []
    current = next((str(v) for v in values if v), "")
    wanted = f"{current},{EXPANDABLE_SEGMENTS}" if current else EXPANDABLE_SEGMENTS
    why = (
        f"{gpu}, rollouts of very different lengths fragment the CUDA caching allocator until an "
        "allocation fails with memory to spare; expandable segments let it grow blocks in place. Set it "
        "in the workers' env_vars (as AReaL's examples/swe/*.yaml do), or export it where the trainer starts."
    )
    title = "CUDA allocator without expandable segments"
    if not paths:  # the YAML leaves scheduling_spec to AReaL's default, so there is no list to override
        return [Finding("warning", f"env:{name}", title, why, f"export {name}={shlex.quote(wanted)}")]
    path = f"actor.scheduling_spec.0.env_vars.{name}"
    return [Finding("warning", path, title, why, override(path, wanted))]
