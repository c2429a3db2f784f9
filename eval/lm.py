"""lm-eval model `scape`: an exported SCAPE checkpoint behind lm-eval's `LM` interface.

    python -m eval.cli --model scape --model_args path=runs/<exp>/<run>/export \
        --device cpu --batch_size 8 --tasks scape_lastword --include_path eval/tasks

Importing this module registers the class under the name `scape`; lm-eval's own
`lm_eval` command never imports it, which is why `eval.cli` exists (it imports this module,
then runs lm-eval's command line unchanged).

model_args: `path` (the export directory, required), `prepared` (the prepared data
directory, when it moved since training), `max_gen_toks` (default 256), and `device` /
`batch_size`, which may also come from lm-eval's `--device` / `--batch_size` (model_args
win when both are given; lm-eval's `--device` defaults to cuda:0, which falls back to the
CPU with a warning on a machine without CUDA). Keys meant for the local
task loaders (`tasks_dir`, `tasks_seed`, `tasks_examples`, see `eval.local_tasks`) are
accepted and ignored here: lm-eval hands all model_args to the tasks as metadata.

All three request types run on `eval.scoring`: loglikelihood in batches (longest first,
right-padded; a continuation longer than the context window in pieces of the window's
length), rolling loglikelihood as lm-eval's disjoint windows of the model's `seq_length`
scored in the same batches, generation greedily one request at a time.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string

from data_prep.progress import Progress, quiet_bars_without_terminal
from data_prep.tokenizers import TextTokenizer
from eval.export import ExportMeta, load_exported, resolve_device
from eval.scoring import greedy_generate, score_continuations

__all__ = ["ScapeLM"]

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 8
# model_args that lm-eval forwards to the task loaders as metadata (eval.local_tasks)
TASK_METADATA_KEYS = frozenset({"tasks_dir", "tasks_seed", "tasks_examples"})


@register_model("scape")
class ScapeLM(TemplateLM):
    def __init__(
        self,
        path: str | None = None,
        device: str = "auto",
        batch_size: int | str = DEFAULT_BATCH_SIZE,
        max_batch_size: int | None = None,
        max_gen_toks: int | str = 256,
        prepared: str | None = None,
        progress: bool = True,
        loaded: tuple[torch.nn.Module, TextTokenizer, ExportMeta] | None = None,
        **unused: Any,
    ) -> None:
        """`loaded` reuses a model already in memory (`load_exported`'s result), else `path`."""
        super().__init__()
        ignored = sorted(unused.keys() - TASK_METADATA_KEYS)
        if ignored:
            log.warning("scape model: ignoring unknown model_args %s", ", ".join(ignored))
        if loaded is None:
            if not path:
                raise ValueError("the scape model needs model_args path=<export directory>")
            loaded = load_exported(path, _usable_device(str(device)), prepared_data_dir=prepared)
        self.model, self.tokenizer, self.meta = loaded
        self._device = next(self.model.parameters()).device
        self.batch_size = _parse_batch_size(batch_size, max_batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.progress = progress
        # lm-eval's own bars (e.g. "Tokenizing inputs") pass disable= explicitly; without a
        # terminal they would fill a log with carriage-return frames
        quiet_bars_without_terminal()

    # lm-eval calls cls(**model_args, **cli_options); its CLI always passes --device (default
    # cuda:0) and --batch_size, so a key also given in model_args would be a TypeError.
    # Here model_args win.
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None):
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**(extra | dict(arg_dict)))

    # what lm-eval needs to know about the model
    @property
    def eot_token_id(self) -> int:
        # the document separator: conditioning on it is "start of a document", as in training
        return self.meta.eod

    @property
    def max_length(self) -> int:
        return self.meta.shape.seq_length

    @property
    def tokenizer_name(self) -> str:
        return f"{self.meta.tokenizer_name}-{self.meta.tokenizer_sha256[:12]}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **_) -> list[int]:
        return self.tokenizer.tokenize(string)

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.detokenize(ids)

    # the three request types
    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
    ) -> list[tuple[float, bool]]:
        # A continuation longer than the context window is scored in pieces of at most
        # max_length tokens, each with as much preceding text as fits (as rolling windows are).
        pieces, owners = [], []
        for k, (_, context, continuation) in enumerate(requests):
            for start in range(0, len(continuation), self.max_length):
                prefix = list(context) + list(continuation[:start])
                pieces.append((prefix, continuation[start : start + self.max_length]))
                owners.append(k)
        totals = [0.0] * len(requests)
        greedy = [True] * len(requests)
        for k, (score, is_greedy) in zip(owners, self._score(pieces, disable_tqdm), strict=True):
            totals[k] += score
            greedy[k] = greedy[k] and is_greedy
        results = list(zip(totals, greedy, strict=True))
        for request, result in zip(requests, results, strict=True):
            if request[0] is not None:
                self.cache_hook.add_partial("loglikelihood", request[0], result)
        return results

    def _score(
        self, pieces: list[tuple[list[int], list[int]]], disable_tqdm: bool
    ) -> list[tuple[float, bool]]:
        # longest first: batches of similar lengths pad little, and running out of memory
        # happens on the first batch rather than after an hour
        order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i][0]) - len(pieces[i][1]))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pieces)
        bar = Progress(
            len(pieces), "loglikelihood", unit="request", enabled=self.progress and not disable_tqdm
        )
        for first in range(0, len(order), self.batch_size):
            batch = order[first : first + self.batch_size]
            scores = score_continuations(
                self.model,
                [pieces[i] for i in batch],
                vocab_size=self.meta.vocab_size,
                max_length=self.max_length,
                pad_id=self.meta.eod,
                device=self._device,
            )
            for i, score in zip(batch, scores, strict=True):
                results[i] = score
            bar.update(len(batch))
        bar.close()
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [req.args[0] for req in requests]
        windows, owners = [], []
        for k, text in enumerate(texts):
            for window in get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            ):
                context, predicted = make_disjoint_window(window)
                windows.append((None, context, predicted))
                owners.append(k)
        totals = [0.0] * len(texts)
        scores = self._loglikelihood_tokens(windows, disable_tqdm)
        for k, (score, _) in zip(owners, scores, strict=True):
            totals[k] += score
        for text, total in zip(texts, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        outputs = []
        bar = Progress(
            len(requests), "generate", unit="request", enabled=self.progress and not disable_tqdm
        )
        for req in requests:
            context, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            if kwargs.get("do_sample"):
                log.warning("scape model decodes greedily; ignoring do_sample/temperature")
            text = greedy_generate(
                self.model,
                self.tok_encode(context),
                vocab_size=self.meta.vocab_size,
                max_length=self.max_length,
                max_new_tokens=kwargs["max_gen_toks"],
                eod=self.meta.eod,
                device=self._device,
                detokenize=self.tok_decode,
                stop=kwargs["until"],
            )
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            outputs.append(text)
            bar.update()
        bar.close()
        return outputs


def _usable_device(device: str) -> str:
    """lm-eval's CLI passes `--device cuda:0` by default; on a CPU-only machine use the CPU."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("scape model: device=%s requested but CUDA is absent; using cpu", device)
        return "cpu"
    return str(resolve_device(device))


def _parse_batch_size(batch_size: int | str, max_batch_size: int | None) -> int:
    text = str(batch_size)
    if text.startswith("auto"):
        # no automatic search: a fixed size is reproducible and the models here are small
        size = int(max_batch_size or DEFAULT_BATCH_SIZE)
        log.warning("scape model: batch_size=auto is not searched; using %d", size)
        return size
    size = int(text)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return size
