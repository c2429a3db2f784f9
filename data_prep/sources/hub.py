"""The paper's corpora by public Hugging Face dataset name, streamed (needs network).

OpenWebText ("Skylion007/openwebtext") and SlimPajama-6B ("DKYoon/SlimPajama-6B") are
read with `datasets.load_dataset(..., streaming=True)`, so nothing is downloaded up front
and `max_documents` really limits the traffic. Without a network, `datasets` retries for
about half a minute before failing; a 5 s reachability probe fails first, with the fix.
Setting HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1 skips the probe and reads the local cache
(``$HF_HOME/datasets``, filled on a machine with internet by ``python -m pipelines.prefetch``);
a dataset missing from it is a one-line error naming it and that command.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlparse

from data_prep.errors import DataPrepError

LoadDataset = Callable[..., Iterable[dict[str, Any]]]


def hub_reachable(timeout_s: float = 5.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout_s):
            return True
    except OSError:
        return False


PREFETCH = "python -m pipelines.prefetch"


def offline_mode() -> bool:
    """HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set: read the local cache, never the network."""
    return any(
        os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
        for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def datasets_cache() -> str:
    """Where `datasets` keeps prepared datasets: $HF_DATASETS_CACHE, else $HF_HOME/datasets."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return os.environ["HF_DATASETS_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "datasets")


def require_hub(what: str) -> None:
    """Fail fast, naming the fix, when the hub cannot be reached and no offline mode is set."""
    if not offline_mode() and not hub_reachable():
        raise DataPrepError(
            f"{what} needs the Hugging Face hub, which is unreachable (no network?); run where "
            "huggingface.co is reachable, or use the offline default (data=enwiki_sample) "
            "or local files (data=local_files data.paths=[...])"
        )


def iter_hub_documents(
    hub_name: str,
    hub_config: str | None,
    hub_split: str,
    hub_revision: str | None,
    text_field: str,
    load_dataset: LoadDataset | None = None,
) -> Iterator[str]:
    """Yield the text of each record; `load_dataset` is injectable so tests need no network."""
    what = f"hub dataset {hub_name!r}"
    if load_dataset is None:
        require_hub(what)
        from datasets import load_dataset  # ~2 s import, only for hub sources

    try:
        records = load_dataset(
            hub_name, hub_config, split=hub_split, streaming=True, revision=hub_revision
        )
        for position, record in enumerate(records):
            text = record.get(text_field)
            if not isinstance(text, str):
                raise DataPrepError(
                    f"{what} record {position} has no string field {text_field!r} "
                    f"(fields: {sorted(record)}); set data.text_field"
                )
            yield text
    except DataPrepError:
        raise
    except Exception as err:  # datasets raises many types (ConnectionError, HfHubHTTPError...)
        first_line = (str(err).splitlines() or [""])[0]
        if offline_mode():
            pinned = f", revision {hub_revision}" if hub_revision else ""
            raise DataPrepError(
                f"{what} (config {hub_config}, split {hub_split}{pinned}) is not in the Hugging Face "
                f"cache {datasets_cache()} and offline mode (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE) "
                f"forbids downloading it; fetch it where the hub is reachable with `{PREFETCH} "
                "experiments=[<experiment>]` and the same HF_HOME"
            ) from err
        raise DataPrepError(
            f"could not stream {what} ({type(err).__name__}: {first_line}); check the name, "
            "config, split and revision, and that the hub is reachable"
        ) from err
