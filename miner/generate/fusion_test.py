"""``tests/fusions/test_<name>.py`` of a promoted fusion: its cases table, one shape for every kind.

The tests themselves live once, in the kind's harness module (``miner_testing.<harness>``, the folder
``tests/harness/``); a fusion's test module holds only ``FUSION`` and ``CASES`` (rows ``(test, case id,
arguments)``, from the kind's ``test_cases`` in ``miner.kinds``) and binds the tests the rows name
(``templates/fusion_test.py.tmpl``).
"""

from __future__ import annotations

from miner.generate.emit import fill_template


def render(*, name: str, ops: str, harness: str, head: str, rows) -> str:
    """The test module of fusion ``name``.

    Parameters
    ----------
    name : str
        The fusion's name.
    ops : str
        What it computes (the candidate's ``ops``).
    harness : str
        The ``miner_testing`` module holding its kind's tests.
    head : str
        The generated-file header.
    rows : sequence of tuple
        ``(test, case id, arguments)``: each row one run of the test it names.

    Returns
    -------
    str
        The module's text.
    """
    cases = "".join(f"    ({test!r}, {cid!r}, {literal(args)}),\n" for test, cid, args in rows)
    return fill_template("fusion_test.py.tmpl", head=head, name=name, ops=ops, harness=harness, cases=cases)


def literal(value) -> str:
    """``repr(value)`` that Python reads back, infinities and NaN included (a masked softmax's ``-inf`` fill:
    ``repr`` writes ``-inf``, a name no module defines)."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


__all__ = ["literal", "render"]
