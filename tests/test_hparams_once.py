"""The optimizer hyper-parameters are defined once, in scape.adams.AdamHParams: every config
that carries them extends it, and no dataclass in the project spells them again."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from pipelines.studies.quality_config import ScaleConfig
from pipelines.training.config import OptimizerConfig
from scape.adams import AdamHParams
from scape.megatron.dense import OptimizerSpec

ROOT = Path(__file__).resolve().parents[1]
SHARED = {f.name for f in dataclasses.fields(AdamHParams)}


@pytest.mark.parametrize("config", [OptimizerSpec, OptimizerConfig, ScaleConfig])
def test_every_carrier_extends_the_one_definition(config: type) -> None:
    assert issubclass(config, AdamHParams)
    own = set(vars(config).get("__annotations__", {}))
    assert not own & SHARED, f"{config.__name__} redeclares {sorted(own & SHARED)}"


def _dataclass_fields(path: Path) -> dict[str, set[str]]:
    """Each @dataclass class of a source file and the fields its own body declares."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
            "dataclass" in ast.unparse(d) for d in node.decorator_list
        ):
            found[node.name] = {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    return found


def test_no_dataclass_spells_the_shared_fields_again() -> None:
    """Two of the shared fields together (e.g. beta1 and beta2, or lr and min_lr) in another
    dataclass is a second definition; scape.adams is the one place they live."""
    offenders = []
    for package in ("scape", "pipelines", "benchmarks", "eval", "data_prep", "scripts"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, fields in _dataclass_fields(path).items():
                if name != "AdamHParams" and len(fields & SHARED) >= 2:
                    offenders.append(f"{path.relative_to(ROOT)}:{name} {sorted(fields & SHARED)}")
    assert not offenders, offenders


def test_shared_copies_exactly_the_shared_fields() -> None:
    o = OptimizerConfig(name="adamw", label="AdamW", lr=1e-3, beta2=0.99, clip_grad=0.5)
    spec = OptimizerSpec(kind="adamw", **o.shared())
    assert dataclasses.asdict(spec) == {**o.shared(), "kind": "adamw"}
    assert (spec.lr, spec.beta2, spec.clip_grad, spec.betas) == (1e-3, 0.99, 0.5, (0.9, 0.99))
