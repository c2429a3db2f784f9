"""environment.yml (clusters) is valid YAML and names the same packages as requirements/cpu.txt."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_FOR = {"torch": "pytorch-gpu", "numpy": "numpy"}


def _names(lines):
    return {
        re.split(r"[=<>!~ ]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
        for line in lines
        if line.strip() and not line.strip().startswith("#")
    }


def test_environment_has_the_cpu_requirements_package_set():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "scape"
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert any(d.startswith("python=3.12") for d in conda)
    have = _names(pip) | _names(conda)
    want = _names((ROOT / "requirements" / "cpu.txt").read_text().splitlines())
    missing = {w for w in want if w not in have and CONDA_FOR.get(w) not in have}
    assert not missing, f"environment.yml lacks {sorted(missing)}"
