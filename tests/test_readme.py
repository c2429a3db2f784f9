"""The README's commands, configs and paths exist and run (in a dry or --help form).

Every ``make ...`` and ``python -m ...`` line of README.md, in a code block or an inline
code span, is run the cheapest way that still fails on a stale one: ``make -n TARGET ...``
(and every ``-m module`` its recipe names must exist), Hydra entry points composed
in-process with the line's overrides (a sweep's values one by one), other modules with
``--help``. Every optimizer, path, link and module it names exists, and it stays short.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("scape", "data_prep", "eval", "pipelines", "benchmarks")
README = REPO / "README.md"
MAX_BYTES = 12_000
# Words of things deleted from the project that a README must not offer again.
GONE = ("ablation_", "masks, encodings")
# Paths a run creates: named in the README, absent from a fresh clone.
OUTPUTS = ("runs", ".venv", "outputs", "data")
SHELL_END = re.compile(r"\s(?:>|2>|\||&&|;|#)")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def _prose(text: str) -> str:
    return re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)


def _inline_spans(text: str) -> list[str]:
    """Inline code spans of the prose, a span broken over lines joined with one space."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", _prose(text))]


def _block_commands(text: str) -> list[str]:
    """Each command line of the fenced blocks: continuations joined, comments dropped."""
    commands = []
    for block in _fenced_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def _commands(prefix: str) -> list[str]:
    text = _text()
    found = []
    for command in _block_commands(text) + _inline_spans(text):
        if command.startswith(prefix):
            found.append(SHELL_END.split(" " + command)[0].strip())
    return sorted(set(found))


MAKE_LINES = _commands("make ")
PYTHON_LINES = _commands("python -m ")


def test_the_readme_is_short_and_names_nothing_deleted():
    text = _text()
    assert len(text.encode()) < MAX_BYTES, (
        f"README.md is {len(text.encode()):,} bytes, over {MAX_BYTES:,}; move findings to "
        "results/*/README.md and link them"
    )
    for word in GONE:
        assert word not in text, f"README.md names {word!r}, which was deleted; remove it"


def test_the_readme_has_commands_to_check():
    # the parser itself: a README whose commands it no longer finds would pass vacuously
    assert {"make test", "make reproduce-table"} <= set(MAKE_LINES)
    assert any(line.startswith("python -m pipelines.pretrain ") for line in PYTHON_LINES)


@pytest.mark.parametrize("line", MAKE_LINES)
def test_each_make_line_is_a_target_whose_recipe_runs_modules_that_exist(line):
    args = shlex.split(line)[1:]
    dry = subprocess.run(
        ["make", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, f"`{line}` in README.md: make -n says {dry.stderr.strip()}"
    for module in re.findall(r"-m (\w[\w.]*)", dry.stdout):
        if module.split(".")[0] not in OUR_PACKAGES:
            continue  # a third-party tool (pip, pybind11, ...) the recipe's venv installs
        assert importlib.util.find_spec(module) is not None, (
            f"`{line}` in README.md runs python -m {module}, which does not exist"
        )


def _hydra_main(module: str) -> dict[str, str] | None:
    """The keyword arguments of the module's ``@hydra.main(...)``, None when it has none."""
    path = REPO / (module.replace(".", "/") + ".py")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "hydra.main":
                    return {k.arg: ast.literal_eval(k.value) for k in decorator.keywords}
    return None


def _compose_each_point(module: str, overrides: list[str], main: dict[str, str]) -> None:
    """Compose the module's config for every point of the overrides' sweep, as the app would."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    importlib.import_module(module)  # registers the module's structured configs
    config_dir = (REPO / module.replace(".", "/")).parent / main["config_path"]
    parsed = OverridesParser.create().parse_overrides(overrides)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base="1.3"):
        for point in BasicSweeper.split_arguments(parsed, None)[0]:
            cfg = compose(main["config_name"], overrides=list(point), return_hydra_config=True)
            with open_dict(cfg):
                del cfg["hydra"]  # Hydra's own part resolves only inside a running app
            OmegaConf.to_object(cfg)  # the typed schema: a wrong key or type fails here


@pytest.mark.parametrize("line", PYTHON_LINES)
def test_each_python_line_composes_or_answers_help(line):
    words = shlex.split(line)
    module, args = words[2], words[3:]
    assert importlib.util.find_spec(module) is not None, (
        f"`{line}` in README.md: no module {module}"
    )
    main = _hydra_main(module) if (REPO / (module.replace(".", "/") + ".py")).is_file() else None
    if main is not None:
        overrides = [a for a in args if a not in ("-m", "--multirun")]
        try:
            _compose_each_point(module, overrides, main)
        except Exception as err:  # Hydra and OmegaConf fail in many types
            pytest.fail(f"`{line}` in README.md does not compose: {type(err).__name__}: {err}")
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    helped = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert helped.returncode == 0, (
        f"`{line}` in README.md: python -m {module} --help failed: {helped.stderr[-500:]}"
    )


def test_every_optimizer_the_readme_names_is_a_config():
    text = _text()
    configs = {p.stem for p in (REPO / "conf" / "optimizer").glob("*.yaml")}
    named = {n for group in re.findall(r"optimizer=([\w,]+)", text) for n in group.split(",")}
    listing = re.search(r"^Optimizers \(`conf/optimizer/`\):(.*?)\n\n", text, flags=re.S | re.M)
    assert listing, "README.md has no 'Optimizers (`conf/optimizer/`):' paragraph"
    named |= set(re.findall(r"`(\w+)`", listing.group(1)))
    assert named, "no optimizer found in README.md"
    missing = sorted(named - configs)
    assert not missing, f"README.md names optimizers {missing} that conf/optimizer/ lacks"


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a markdown file's headings: lower case, punctuation dropped,
    spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_path_link_and_module_the_readme_names_exists():
    text = _text()
    top = {p.name for p in REPO.iterdir()}
    problems = []
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith(("http://", "https://", "#")):
            continue
        path, _, anchor = target.partition("#")
        if not (REPO / path).exists():
            problems.append(f"link {target}")
        elif anchor and anchor not in _anchors(REPO / path):
            problems.append(f"link {target} (no such heading)")
    for span in _inline_spans(text) + [w for c in _block_commands(text) for w in c.split()]:
        for token in span.split():
            token = token.strip(",;:()")
            first = token.split("/")[0]
            if "/" not in token or any(c in token for c in "<$*=") or first in OUTPUTS:
                continue
            if first in top and not (REPO / token).exists():
                problems.append(f"path {token}")
    for span in _inline_spans(text):
        if re.fullmatch(r"(scape|data_prep|eval|pipelines|benchmarks)(\.\w+)+", span):
            module, _, attribute = span.rpartition(".")
            if importlib.util.find_spec(span) is None and not hasattr(
                importlib.import_module(module), attribute
            ):
                problems.append(f"module {span}")
    row = re.search(r"^\| `scape/` \|(.*)$", text, flags=re.M)
    assert row, "README.md's layout table has no `scape/` row"
    for name in re.findall(r"`(\w+)`", row.group(1)):
        if not (REPO / "scape" / f"{name}.py").is_file():
            problems.append(f"module scape/{name}.py")
    assert not problems, f"README.md names what does not exist: {', '.join(problems)}"


def test_the_verdict_is_the_early_gap_reports_word_for_word():
    """The README's verdict block is written by the early-gap report (`make early-gap-report`)
    into both READMEs; a hand edit of either makes them differ."""

    def block(path: Path) -> str:
        text = path.read_text(encoding="utf-8")
        return text.split("<!-- verdict:begin -->", 1)[1].split("<!-- verdict:end -->", 1)[0]

    assert block(REPO / "README.md") == block(REPO / "results" / "early_gap" / "README.md")
