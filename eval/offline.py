"""Fail fast, in one line, when a task needs the Hugging Face hub and there is none.

lm-eval's standard tasks download their data from the hub. Without a network `datasets`
retries for about 30 s and then raises deep inside task loading; this check answers in at
most a few seconds, before any model is loaded, with the task's name and the fix. With
`HF_DATASETS_OFFLINE=1` / `HF_HUB_OFFLINE=1` set, the user says the data is in the local
HF cache: no probe then, and a cache miss is reported by `hub_load_error`.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable
from urllib.parse import urlparse

from eval.errors import EvalError

__all__ = ["STANDARD_TASKS", "check_hub_tasks", "hub_load_error", "hub_reachable"]

# the paper-scale zero-shot set (all need the hub or a filled local cache)
STANDARD_TASKS = ("lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande")
_TRUE = {"1", "true", "yes", "on"}


def offline_cache_requested() -> bool:
    return any(
        os.environ.get(k, "").lower() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_reachable(timeout: float = 3.0) -> bool:
    """Can a TCP connection to the hub (or `HF_ENDPOINT`) be opened within `timeout`?"""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (80 if url.scheme == "http" else 443)
    answer: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((url.hostname or "", port), timeout=timeout).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    # name resolution ignores socket timeouts; a daemon thread bounds the whole probe
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return bool(answer and answer[0])


def _fix(local_tasks: Iterable[str]) -> str:
    return (
        "run where huggingface.co is reachable, or fill a Hugging Face cache there with "
        "`python -m pipelines.prefetch` and set HF_HOME=<that cache> HF_DATASETS_OFFLINE=1 "
        "HF_HUB_OFFLINE=1 here; offline tasks: " + ",".join(local_tasks)
    )


def check_hub_tasks(tasks: Iterable[str], local_tasks: Iterable[str]) -> None:
    local = tuple(local_tasks)
    remote = [t for t in tasks if t not in local]
    if not remote or offline_cache_requested() or hub_reachable():
        return
    raise EvalError(
        f"task {remote[0]} needs its data from the Hugging Face hub, which is unreachable; "
        + _fix(local)
    )


def hub_load_error(remote: list[str], local_tasks: Iterable[str], err: Exception) -> EvalError:
    """The one-line error for a standard task whose data could not be loaded."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    where = "; it is not in the local Hugging Face cache" if offline_cache_requested() else ""
    return EvalError(
        f"could not load the data of task {', '.join(remote)} ({type(err).__name__}: {first})"
        f"{where}; " + _fix(local_tasks)
    )
