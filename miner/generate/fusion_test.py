"""``tests/fusions/test_<name>.py`` of a promoted fusion: its cases table (the tests are the harness's).

The tests themselves live once, in ``miner.check.fusion_harness``; a fusion's test module holds only
its table (``templates/fusion_test.py.tmpl``): the fusion, its input kinds, the cases of
``miner.check.cases.fusion_cases``, the training step's expected matches and its zoo model.
"""

from __future__ import annotations

from miner.check.cases import fusion_cases
from miner.generate.emit import fill_template


def render(name: str, meta: dict, head: str, train_matches: int, zoo: tuple[str, str] | None) -> str:
    """The test module of fusion ``name``.

    Parameters
    ----------
    name : str
        The fusion's name.
    meta : dict
        The candidate's ``candidate.json``.
    head : str
        The generated-file header.
    train_matches : int
        The matches the training test asserts (``miner.check.fusion_harness.train_matches``).
    zoo : tuple of str or None
        ``(model, mode)`` for the slow in-model test (``miner.check.checks.pick_model``).

    Returns
    -------
    str
        The module's text.
    """
    cases = "".join(f"    ({shapes!r}, {scalars!r}, {label!r}),\n" for shapes, scalars, label in fusion_cases(meta))
    return fill_template(
        "fusion_test.py.tmpl", head=head, name=name, ops=meta["ops"],
        input_kinds=repr(list(meta["signature"]["input_kinds"])), cases=cases, train_matches=int(train_matches), zoo=repr(tuple(zoo) if zoo else None))


__all__ = ["render"]
