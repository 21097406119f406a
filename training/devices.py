"""Where the policy runs, in which dtype, and which process of a multi-GPU launch does what.

The policy goes to its process's GPU (`cuda:$LOCAL_RANK`) when CUDA is available, else to the CPU
(`CUDA_VISIBLE_DEVICES=` keeps a GPU machine on the CPU). `model.dtype: auto` is bfloat16 on a GPU that
supports it and float32 otherwise (float32 trains and generates fastest on CPUs). The TRL arguments
`use_cpu` and `bf16` follow from that device unless a config sets them (`precision_args`).

Under `accelerate launch` (WORLD_SIZE > 1) every process runs the trainer, and TRL shards each GRPO or SFT
batch across them. What a trainer does outside TRL (rollouts and dev runs through the agent graphs,
checkpoints, log lines) runs on the main process only (`on_main_process`): the others wait for it on a gloo
group (up to SYNC_TIMEOUT, as a rollout on one GPU can take hours) and then read what it wrote; an error on
the main process is raised on every process.
"""

from __future__ import annotations

import atexit
import functools
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from mhqa_graph.errors import InvalidInput, TrainingError

DTYPES = ("auto", "float32", "bfloat16", "float16")
SYNC_TIMEOUT = timedelta(hours=24)  # the other processes wait this long for the main one's rollouts
DDP_TIMEOUT = timedelta(seconds=1800)  # the process group's own collectives: transformers' ddp_timeout default

T = TypeVar("T")


def world_size() -> int:
    """How many processes run the training (accelerate launch / torchrun set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE") or 1)


def is_main_process() -> bool:
    return int(os.environ.get("RANK") or 0) == 0


def policy_device() -> Any:
    """The torch device of this process's policy: `cuda:$LOCAL_RANK` when CUDA is available, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK") or 0))
    return torch.device("cpu")


def bf16_supported(device: Any) -> bool:
    import torch

    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def policy_dtype(name: str, device: Any = None) -> Any:
    """The torch dtype of `model.dtype`: `auto` is bfloat16 on a GPU that supports it, else float32."""
    import torch

    if name not in DTYPES:
        raise InvalidInput(f"model.dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    if name == "auto":
        return torch.bfloat16 if bf16_supported(device or policy_device()) else torch.float32
    return getattr(torch, name)


CHECKPOINTING = ("activation_checkpointing", "gradient_checkpointing")  # transformers 5's name, the older one


def precision_args(args: dict[str, Any]) -> dict[str, Any]:
    """TRL's `use_cpu` and `bf16` as the policy's device implies (the CPU: use_cpu, no bf16; a GPU: bf16
    mixed precision when it supports it and fp16 is not asked for), and activation (gradient) checkpointing on
    CUDA, where a 7B policy's activations would not fit otherwise; for the keys `args` does not set."""
    device = policy_device()
    derived = {"use_cpu": device.type == "cpu", "bf16": bf16_supported(device) and not args.get("fp16")}
    if device.type == "cuda" and not any(k in args for k in CHECKPOINTING):
        derived |= {"activation_checkpointing": True,
                    "activation_checkpointing_kwargs": {"use_reentrant": False}}  # works with a frozen LoRA base
    return {key: value for key, value in derived.items() if key not in args}


@functools.cache
def _sync_group() -> Any:
    """A gloo group of all processes with a long timeout (the default group, if this process has none yet,
    is set up as transformers' Trainer would)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        from accelerate import PartialState

        PartialState(timeout=DDP_TIMEOUT)
    atexit.register(_close)  # a group left to the interpreter's exit can abort the process (SIGABRT)
    return dist.new_group(backend="gloo", timeout=SYNC_TIMEOUT)


def _close() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def on_main_process(fn: Callable[[], T], share: bool = False) -> T | None:
    """`fn()` run by the main process only; the other processes wait for it and get None (with `share`, the
    main process's value, which must pickle). An exception on the main process is raised there and, as
    TrainingError, on every other one. With one process, just `fn()`."""
    if world_size() == 1:
        return fn()
    import torch.distributed as dist

    value, failure = None, None
    if is_main_process():
        try:
            value = fn()
        except Exception as exc:  # every process must learn of it, or the others wait for ever
            failure = exc
    message = [None if failure is None else f"{type(failure).__name__}: {failure}", value if share else None]
    dist.broadcast_object_list(message, src=0, group=_sync_group())
    if failure is not None:
        raise failure
    if message[0] is not None:
        raise TrainingError(f"the main process failed, so this one stops too: {message[0]}")
    return message[1] if share else value


def barrier() -> None:
    """Every process waits here until all have come (nothing to wait for with one process)."""
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier(group=_sync_group())
