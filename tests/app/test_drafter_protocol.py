"""The loop and the session know a trained drafter by the ``TrainedDrafter`` Protocol alone (mypy checks that
every drafter class meets it, where the session builds one): no module outside a drafter's own branches on
its class, so a new kind of drafter is its own module and one entry in ``session.HEAD_DRAFTERS``."""

from __future__ import annotations

import ast
from pathlib import Path

from app.engine import session
from app.engine.dflash import DFLASH_ARCH
from app.engine.eagle3 import EAGLE3_ARCH

ROOT = Path(__file__).resolve().parents[2]
DRAFTERS = {"ModelDrafter", "MTPDrafter", "Eagle3Drafter", "DFlashDrafter"}
OWN_MODULES = {"drafters.py", "mtp.py", "eagle3.py", "dflash.py"}


def class_checks(source: str) -> list[int]:
    """The lines of ``isinstance(x, SomeDrafter)`` calls in ``source``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) > 1 and {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} & DRAFTERS:
            lines.append(node.lineno)
    return lines


def test_no_module_branches_on_a_drafter_class() -> None:
    modules = [p for p in (ROOT / "app").rglob("*.py") if p.name not in OWN_MODULES]
    assert len(modules) > 100
    hits = [f"{p.relative_to(ROOT)}:{line}" for p in modules for line in class_checks(p.read_text(encoding="utf-8"))]
    assert hits == []


def test_the_check_sees_a_branch_on_a_drafter_class() -> None:
    assert class_checks("def f(d):\n    return isinstance(d, MTPDrafter | DFlashDrafter)\n") == [2]
    assert class_checks("def f(d):\n    return isinstance(d, (int, ModelDrafter))\n") == [2]
    assert class_checks("def f(d):\n    return isinstance(d, Draft)\n") == []


def test_head_drafters_are_registered_by_architecture() -> None:
    assert set(session.HEAD_DRAFTERS) == {DFLASH_ARCH, EAGLE3_ARCH}
