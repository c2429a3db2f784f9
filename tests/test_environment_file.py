"""environment.yml (clusters) is valid YAML, names the same packages as requirements/cpu.txt and
pins the megatron-core that make test-mcore-latest tests."""

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


def _pin(lines, package: str) -> str | None:
    for line in lines:
        match = re.match(rf"\s*{re.escape(package)}==([^\s\\;#]+)", line)
        if match:
            return match.group(1)
    return None


def test_environment_pins_the_megatron_core_tested_beside_the_cpu_pin():
    """The cluster installs exactly the megatron-core of requirements/mcore-latest.txt (the
    second tested version), and it is not the CPU machine's 0.16.1."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    latest = (ROOT / "requirements" / "mcore-latest.txt").read_text().splitlines()
    cpu = (ROOT / "requirements" / "cpu.txt").read_text().splitlines()
    tested = _pin(latest, "megatron-core")
    assert tested is not None, "requirements/mcore-latest.txt pins no megatron-core"
    assert _pin(pip, "megatron-core") == tested
    assert _pin(cpu, "megatron-core") not in (None, tested)
    assert any("--hash=sha256:" in line for line in latest), "the wheel must be hash-pinned"
