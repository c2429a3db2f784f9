"""Hydra stage: prepare a corpus as Megatron indexed datasets.

    python -m pipelines.prepare                         # offline default: enwiki_sample + bytebpe4k
    python -m pipelines.prepare data=openwebtext tokenizer=gpt2 num_proc=16
    python -m pipelines.prepare data=local_files 'data.paths=[corpus/*.jsonl]' tokenizer=llama_sp32k

`run(cfg)` does the work and is what tests call; `main` only adds the command line:
printing the summary, and turning a `DataPrepError` into one `error: ...` line on stderr
with a non-zero exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_prep.config import PrepareConfig
from data_prep.errors import DataPrepError
from data_prep.prepare import PrepareResult, prepare
from data_prep.progress import quiet_bars_without_terminal
from pipelines.stage import command_line, one_line_errors, register_schema

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("data", "tokenizer")


register_schema("prepare", PrepareConfig)


def run(cfg: PrepareConfig | DictConfig, command: str | None = None) -> PrepareResult:
    if isinstance(cfg, DictConfig):
        try:
            cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
        except OmegaConfBaseException as err:
            # e.g. a mandatory value (???) left unset: name the key and how to set it
            raise DataPrepError(f"{err.msg}; set it on the command line (key=value)") from err
    assert isinstance(cfg, PrepareConfig)
    return prepare(cfg, command=command)


def unknown_group_choice(overrides: list[str]) -> str | None:
    """Hydra reports an unknown `data=`/`tokenizer=` over many lines; we want one."""
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if sep and key in GROUPS and not (CONF_DIR / key / f"{value}.yaml").is_file():
            known = ", ".join(sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml")))
            return f"unknown {key} {value!r}; use one of: {known} (or add conf/{key}/{value}.yaml)"
    return None


@hydra.main(config_path="../conf", config_name="prepare", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_bars_without_terminal()
    with one_line_errors(DataPrepError, status=1):
        result = run(cfg, command=command_line("pipelines.prepare"))
    print(result.summary())


if __name__ == "__main__":
    problem = unknown_group_choice(sys.argv[1:])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    main()
