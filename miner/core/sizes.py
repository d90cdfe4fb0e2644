"""Shapes captured on the tiny preset, scaled to a model's published size (the zoo's ``dims``).

A tiny-preset capture stands for the model users run: each dimension is matched by value to a
*role* of the tiny configuration (``B*S``, ``hidden``, ``vocab``, ...) and replaced by that role's
size at the ``base`` preset. The sizes come from the zoo (``miner_models.dims``), never restated.
"""

from __future__ import annotations

from typing import Any, Sequence


def roles(d: Any, leading: bool) -> dict[str, int]:
    """Named sizes a dimension of a model with sizes ``d`` can stand for; activation roles first (they win a tie).

    ``leading``: a leading dimension (activation roles first) rather than the last (widths first).
    """
    b, s, h = d.batch, d.seq, d.heads
    if leading:
        return {"B": b, "S": s, "S-1": s - 1, "B*S": b * s, "B*(S-1)": b * (s - 1), "H": h, "B*H": b * h,
                "B*H*S": b * h * s, "head_dim": d.head_dim, "hidden": d.hidden, "inter": d.inter, "vocab": d.vocab}
    return {"hidden": d.hidden, "inter": d.inter, "vocab": d.vocab, "S": s, "S-1": s - 1,
            "head_dim": d.head_dim, "B": b, "H": h}


def published_dims(model: str):
    """``miner_models.dims(model, "base")``; ``ValueError`` for a model without pinned sizes."""
    import miner_models

    try:
        return miner_models.dims(model, "base")
    except KeyError:
        raise ValueError(f"no published size known for model {model!r}") from None


def derive_shape(shape: Sequence[int], model: str, tiny: Any = None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Scale a shape captured on the tiny preset to ``model``'s published size.

    Parameters
    ----------
    shape : sequence of int
        The captured shape.
    model : str
        A hand-written zoo model (``bert``, ``gpt2``, ``llama``, ...).
    tiny : Dims, optional
        The tiny sizes the shape was captured with (default: the zoo's tiny preset of ``model``).

    Returns
    -------
    (shape, roles)
        E.g. ``((16, 12, 512, 512), ("B", "H", "S", "S"))``. The last dimension prefers width roles,
        the others activation roles.

    Raises
    ------
    ValueError
        For a size no role explains, or a model without pinned sizes.
    """
    import miner_models

    base = published_dims(model)
    tiny = tiny or miner_models.dims(model, "tiny")
    out, names = [], []
    for i, size in enumerate(shape):
        if size == 1:
            out.append(1)
            names.append("1")
            continue
        leading = i < len(shape) - 1
        tiny_roles, base_roles = roles(tiny, leading), roles(base, leading)
        role = next((r for r, v in tiny_roles.items() if v == size), None)
        if role is None:
            raise ValueError(f"size {size} (dim {i} of {tuple(shape)}) matches no role of the tiny preset")
        out.append(base_roles[role])
        names.append(role)
    return tuple(out), tuple(names)
