"""lm-eval's own command line, with the `scape` model registered; installed as
``scape-lm-eval`` (``make setup``), also runnable as ``python -m eval.cli``.

    scape-lm-eval --model scape --model_args path=runs/<exp>/<run>/export \
        --device cpu --batch_size 8 --tasks scape_lastword,scape_nextsent,scape_testppl \
        --include_path eval/tasks

lm-eval finds models only in its registry and never imports project code, so `lm_eval
--model scape` cannot work by itself (its registry has no entry-point hook); this wrapper imports `eval.lm` (which registers the
class) and then hands the unchanged arguments to lm-eval's `cli_evaluate`. Every lm-eval
option works as documented (`--limit`, `--output_path`, `--log_samples`, ...). Note that
lm-eval indexes all of its bundled task configs on start-up (15-60 s of CPU).
"""

from __future__ import annotations

import eval.lm  # noqa: F401  (registers the `scape` model)
from data_prep.progress import quiet_bars_without_terminal


def main() -> None:
    quiet_bars_without_terminal()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
