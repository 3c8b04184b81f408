"""Every configuration key of the remedies table exists in the installed framework's source.

rlmon.service.metrics.remedies names, for each alert, the keys of verl (Hydra paths in its
generated trainer config), OpenRLHF (command-line flags of ``train_ppo_ray``), SkyRL (paths into
its ``SkyRLTrainConfig`` dataclasses) and TRL (``GRPOConfig`` fields, some inherited from
transformers' ``TrainingArguments``). Each key's ``source`` file is read from the installed package
(``verl`` 0.9.1, ``openrlhf`` 0.11.2, ``skyrl`` 0.3.0, ``trl``, in the extras venv) and the key is
looked up the way the framework reads it: a renamed or removed key fails here, not in a
notification someone acts on at 3 a.m.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import pytest

from rlmon.service.metrics.remedies import FRAMEWORKS, REMEDIES, Knob

pytestmark = pytest.mark.frameworks

KNOBS = [(fw, knob) for remedy in REMEDIES for fw, knobs in remedy.knobs.items()
         for knob in knobs]


def package_root(top: str) -> Path:
    """The installed package's directory (found, not imported: verl's import needs a GPU stack)."""
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get("RLMON_REQUIRE_EXTRAS") == "1":
            raise AssertionError(f"{top} is not installed in the extras venv")
        pytest.skip(f"{top} is not installed (make .venv-extras/.installed)")
    return Path(next(iter(spec.submodule_search_locations))).parent


def yaml_keys(text: str) -> set[str]:
    """Every dotted path of a YAML mapping."""
    import yaml

    out: set[str] = set()

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                path = f"{prefix}{key}"
                out.add(path)
                walk(value, path + ".")

    walk(yaml.safe_load(text), "")
    return out


def cli_flags(text: str) -> set[str]:
    """The flags a module's ``add_argument`` calls define; ``f"--{prefix}.x"`` (OpenRLHF's
    optimizer flags, defined once for the actor and once for the critic) gives both."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args):
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            flags.add(first.value)
        elif isinstance(first, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in first.values]
            pattern = "".join(str(p) for p in parts)
            flags.update(pattern.replace("{}", role) for role in ("actor", "critic"))
    return flags


def class_fields(text: str) -> dict[str, dict[str, str]]:
    """class name -> {annotated field: its annotation's text} of a module's classes."""
    out: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            out[node.name] = {stmt.target.id: ast.unparse(stmt.annotation)
                              for stmt in node.body
                              if isinstance(stmt, ast.AnnAssign)
                              and isinstance(stmt.target, ast.Name)}
    return out


def dataclass_path(classes: dict[str, dict[str, str]], root: str, path: str) -> bool:
    """Whether ``path`` (a.b.c) leads through the annotated fields from class ``root``."""
    current = root
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields = classes.get(current, {})
        if part not in fields:
            return False
        if i < len(parts) - 1:
            current = fields[part].split("[")[0].strip()  # Optional[X] is not followed
    return True


def has_key(framework: str, knob: Knob, text: str) -> bool:
    if framework == "verl":
        return knob.key in yaml_keys(text)
    if framework == "openrlhf":
        return knob.key in cli_flags(text)
    if framework == "skyrl":
        return dataclass_path(class_fields(text), "SkyRLTrainConfig", knob.key)
    if framework == "trl":  # a field of GRPOConfig, or of the TrainingArguments it inherits
        cls = "GRPOConfig" if knob.source.startswith("trl/") else "TrainingArguments"
        return knob.key in class_fields(text).get(cls, {})
    raise AssertionError(f"no check for framework {framework!r}")


def test_every_framework_has_keys() -> None:
    assert {fw for fw, _ in KNOBS} == set(FRAMEWORKS)


@pytest.mark.parametrize(("framework", "knob"), KNOBS,
                         ids=[f"{fw}:{k.key}" for fw, k in KNOBS])
def test_key_is_in_the_framework_source(framework: str, knob: Knob) -> None:
    top, _, rest = knob.source.partition("/")
    source = package_root(top) / top / rest
    assert source.is_file(), f"{framework}: {knob.source} is not in the installed {top}"
    text = source.read_text(encoding="utf-8")
    assert has_key(framework, knob, text), (
        f"{framework}: `{knob.key}` is not defined in {knob.source} (renamed or removed?)")


def test_the_checks_can_fail() -> None:
    """A misspelt key fails each framework's check (the lookups are not vacuous)."""
    verl = "actor_rollout_ref:\n  actor:\n    clip_ratio_high: 0.2\n"
    assert yaml_keys(verl) >= {"actor_rollout_ref.actor.clip_ratio_high"}
    assert "actor_rollout_ref.actor.clip_ratio_hi" not in yaml_keys(verl)
    cli = ('p.add_argument("--actor.eps_clip", type=float)\n'
           'p.add_argument(f"--{prefix}.adam.lr", type=float)\n')
    assert cli_flags(cli) == {"--actor.eps_clip", "--actor.adam.lr", "--critic.adam.lr"}
    classes = class_fields("class SkyRLTrainConfig:\n    trainer: TrainerConfig\n"
                           "class TrainerConfig:\n    algorithm: AlgorithmConfig\n"
                           "class AlgorithmConfig:\n    eps_clip_high: float = 0.2\n")
    assert dataclass_path(classes, "SkyRLTrainConfig", "trainer.algorithm.eps_clip_high")
    assert not dataclass_path(classes, "SkyRLTrainConfig", "trainer.algorithm.eps_clip")
    assert not dataclass_path(classes, "SkyRLTrainConfig", "generator.algorithm.eps_clip_high")
