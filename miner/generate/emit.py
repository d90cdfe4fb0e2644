"""Lowered program -> Triton source: ``one_pass_kernel``, ``looped_kernel`` and the whole kernel.py.

``kernel_source(prog)`` writes the two kernels of one ``miner.generate.lower.Program``;
``render_kernel_py(prog, head)`` the generated ``kernel.py`` around them (template
``templates/kernel.py.tmpl``). Kernels import the ``@triton.jit`` helpers they call from
``miner.runtime.jit`` (never pasted); each line computing a pattern node ends with a comment naming
its op (``# aten.sub``).
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

from miner.core import source
from miner.generate.lower import PatternSpec, Program, Value, signature_params

TEMPLATES = Path(__file__).with_name("templates")
# miner.runtime.jit's helpers (its __all__ but the fill_random kernel)
JIT_HELPERS = ("tanh", "pow_rt", "pow_c", "load_masked", "load_full", "uniform", "normal", "uniform_tile4",
               "uniform_at", "gather_masked", "gather_full", "store_mask")


# a reduction's per-row result from its [ROWS, BLOCK] accumulator (or masked operand) ``a``
_FINAL = {"sum": "tl.sum({a}, axis=1)[:, None]", "max": "tl.max({a}, axis=1)[:, None]",
          "min": "tl.min({a}, axis=1)[:, None]", "any": "tl.max({a}, axis=1)[:, None] != 0",
          "mean": "tl.sum({a}, axis=1)[:, None] / n_cols", "m2": "tl.sum({a}, axis=1)[:, None] / {d}"}
# a reduction's operand in a masked chunk (padding lanes hold the reduction's identity) ...
_MASKED = {"sum": "tl.where(mask, {x}, 0.0)", "mean": "tl.where(mask, {x}, 0.0)",
           "m2": "tl.where(mask, {sq}, 0.0)", "max": 'tl.where(mask, {x}, float("-inf"))',
           "min": 'tl.where(mask, {x}, float("inf"))', "any": "tl.where(mask, {x}, 0).to(tl.int32)"}
# ... and in a full chunk, where every lane is a real column (others: the operand itself)
_FULL = {"m2": "{sq}", "any": "{x}.to(tl.int32)"}


def _op(val: Value) -> str:
    """The trailing ``# aten.op`` comment of a line computing ``val`` ("" for none)."""
    return f"  # {val.op}" if val.op else ""


class _Emitter:
    """Emits the kernel bodies for one Program."""

    def __init__(self, prog: Program):
        self.p = prog
        self.v = prog.values

    # -- which vec values a set of targets needs (recomputed per pass)
    def _vec_closure(self, roots: list[str]) -> list[str]:
        need: set[str] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            val = self.v[n]
            if val.kind != "vec" or n in need:
                continue
            need.add(n)
            stack.extend(val.deps)
        return [n for n in self.v if n in need]  # topological order

    def _vec_lines(self, names: list[str], aligned: bool = False, masked: bool = True) -> list[str]:
        """Loads and pointwise lines. ``aligned`` (looped kernel): ``cols`` count from the row's
        16-aligned start ``abase``; an input laid out like the rows (``X{k}_ALIGNED``) is read at
        ``abase + cols`` (vectorizable), any other at its logical column ``cols - lead``."""
        lines = []
        if aligned and any(self.v[n].random for n in names):
            lines.append("lin = abase + cols  # row-major element offset: row_start + (cols - lead)")
        for n in names:
            val = self.v[n]
            if val.gather is not None:
                lines.append(self._gather_line(val, aligned, masked))
            elif n in self.p.inputs:
                k = self.p.inputs.index(n)
                cast = "" if val.is_bool or val.index else ".to(tl.float32)"
                if aligned:
                    where = f"x{k}_ptr, x{k}_row, x{k}_sc, abase, lead, cols"
                    load = f"load_masked({where}, mask, X{k}_ALIGNED)" if masked else f"load_full({where}, X{k}_ALIGNED)"
                    lines.append(f"{n} = {load}{cast}")
                elif k in self.p.spec.column_inputs:
                    lines += [f"if X{k}_COL:  # the same for every row: one [1, BLOCK] load per program, kept in L2",
                              f'    {n} = tl.load(x{k}_ptr + cols * x{k}_sc, mask=cols < n_cols, other=0, '
                              f'eviction_policy="evict_last"){cast}',
                              "else:",
                              f"    {n} = tl.load(x{k}_row + cols * x{k}_sc, mask=mask, other=0){cast}"]
                else:
                    lines.append(f"{n} = tl.load(x{k}_row + cols * x{k}_sc, mask=mask, other=0){cast}")
            elif val.random and self.p.rand4:
                lines += self._rand4_lines(val, aligned)
            else:
                lines.append(f"{n} = {val.expr}" + _op(val))
        return lines

    def _gather_line(self, val: Value, aligned: bool, masked: bool) -> str:
        """``table[index, col]`` at each element: the table's row input (``x<w>_row``, its column seen
        through the gather's views) plus the loaded index times the table's row stride ``x<w>_g``."""
        w = val.gather.table
        col = "(cols - lead)" if aligned else "cols"
        where = f"x{w}_row, x{w}_sc, {col}, {val.deps[0]}, x{w}_g"
        call = f"gather_masked({where}, mask)" if masked else f"gather_full({where})"
        return f"{val.name} = {call}.to(tl.float32)" + _op(val)

    def _rand4_lines(self, val: Value, aligned: bool) -> list[str]:
        """The four-per-call stream: one Philox call per group of four elements when the tile
        covers whole aligned groups (``RAND4``, set at launch), else one per element (same numbers).
        One-pass: a row starts at group ``rows * n_cols / 4`` when ``n_cols % 4 == 0``; looped: a
        chunk starts at ``abase + chunk``, a multiple of 16 plus a multiple of BLOCK."""
        first = "(abase + chunk) // 4" if aligned else "rows * (n_cols // 4)"
        seed = val.deps[0]
        return ["if RAND4:  # whole groups of four elements: one Philox call per group, words interleaved",
                f"    {val.name} = uniform_tile4({seed}, {first} + tl.arange(0, BLOCK // 4)[None, :])" + _op(val),
                "else:",
                f"    {val.name} = {val.expr}" + _op(val)]

    def _row_pointwise_after(self, level: int, done: set[str]) -> list[str]:
        lines = []
        for n, val in self.v.items():
            if val.kind == "row" and val.reduce is None and val.expr and n not in done \
                    and all(d in done for d in val.deps):
                lines.append(f"{n} = {val.expr}" + _op(val))
                done.add(n)
        return lines

    def _finalize(self, r: Value, acc: str) -> str:
        return self._reduced(r, acc) + _op(r)

    def _reduced(self, r: Value, acc: str) -> str:
        return f"{r.name} = " + _FINAL[r.reduce].format(a=acc, d=r.divisor)

    def _masked(self, r: Value, masked: bool = True) -> str:
        x = r.operand
        sq = f"({x} - {r.center}) * ({x} - {r.center})"  # m2: the squared deviation
        return (_MASKED if masked else _FULL).get(r.reduce, "{x}").format(x=x, sq=sq)

    def _stores(self, kinds: str, aligned: bool = False, masked: bool = True) -> list[str]:
        lines = []
        for i, o in enumerate(self.p.outputs):
            val = self.v[o]
            if val.kind != kinds:
                continue
            if kinds == "vec" and val.is_bool:  # bool, or bits where the launch asks for them (a saved mask)
                # the bool store exactly as any output's; the bits' span (start, lo, hi) per byte (jit.store_mask)
                if not aligned:
                    span = "rows * n_cols + cols, {o}, mask, rows * n_cols, 0, tl.where(row_mask, n_cols, 0)"
                elif masked:
                    span = "abase + cols, {o}, mask, abase + chunk, lead - chunk, end - chunk"
                else:
                    span = "abase + cols, {o}, None, abase + chunk, None, None"
                lines.append(f"store_mask(out{i}_ptr, {span.format(o=o)})")
            elif kinds == "vec":
                at = "abase + cols" if aligned else "rows * n_cols + cols"
                m = ", mask=mask" if masked else ""
                lines.append(f"tl.store(out{i}_ptr + {at}, {o}.to(out{i}_ptr.dtype.element_ty){m})")
            else:
                lines.append(f"tl.store(out{i}_ptr + rows, {o}.to(out{i}_ptr.dtype.element_ty), mask=row_mask)")
        return lines

    # -- signature and prologue shared by both kernels
    def signature(self, name: str, aligned: bool = False) -> str:
        n_out = len(self.p.outputs)
        rows_in = self._row_inputs()
        params = [f"x{k}_ptr" for k in self.p.seed_inputs] + [f"x{k}_ptr" for k in rows_in]
        params += [f"out{i}_ptr" for i in range(n_out)]
        # scalar constants are compile-time: one specialization per value (eps, scales and
        # exponents are fixed per model), folded into the arithmetic; a seed index is a runtime
        # int (it differs in every layer: one compile for all of them)
        params += [f"c{c}" if c in self.p.seed_consts else f"c{c}: tl.constexpr" for c in range(self.p.spec.n_consts)]
        params += [f"x{g.table}_g" for g in self.p.gathers]  # an embedding table's row stride (runtime)
        params += ["n_rows", "n_cols", "d1", "d2"]
        params += [f"x{k}_s{d}" for k in rows_in for d in ("0", "1", "2", "c")]
        params += ["ROWS: tl.constexpr", "BLOCK: tl.constexpr"]
        if aligned:
            params += [f"X{k}_ALIGNED: tl.constexpr" for k in rows_in]
        else:
            params += [f"X{k}_COL: tl.constexpr" for k in self.p.spec.column_inputs]
        if self.p.rand4:
            params.append("RAND4: tl.constexpr")
        return f"@triton.jit\ndef {name}(\n    " + ",\n    ".join(
            ", ".join(params[i:i + 6]) for i in range(0, len(params), 6)) + ",\n):"

    def prologue(self) -> list[str]:
        lines = [
            "rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]).to(tl.int64)",
            "row_mask = rows < n_rows",
            "i0 = rows // (d1 * d2)",
            "i1 = (rows // d2) % d1",
            "i2 = rows % d2",
        ]
        for k in self._row_inputs():
            lines.append(f"x{k}_row = x{k}_ptr + i0 * x{k}_s0 + i1 * x{k}_s1 + i2 * x{k}_s2")
        for n, val in self.v.items():
            if val.kind == "seed" and val.expr:  # one dropout seed per program
                lines.append(f"{n} = {val.expr}" + _op(val))
        return lines

    def _row_inputs(self) -> list[int]:
        """The inputs read per element (all but the seed vectors)."""
        return [k for k in range(len(self.p.inputs)) if k not in self.p.seed_inputs]

    def one_pass(self) -> str:
        body = self.prologue() + [
            "cols = tl.arange(0, BLOCK)[None, :]",
            "mask = row_mask & (cols < n_cols)",
        ]
        if self.p.random:
            body.append("lin = rows * n_cols + cols  # row-major element offset (the random numbers' counter)")
        done: set[str] = set()
        for n, val in self.v.items():
            if val.kind == "vec":
                body += self._vec_lines([n])
            elif val.kind == "row" and val.reduce:
                if val.online_max:
                    body.append(f"{n} = tl.sum({self._masked(val)}, axis=1)[:, None]" + _op(val))
                else:
                    body.append(self._finalize(val, self._masked(val)))
                done.add(n)
            elif val.kind == "row":
                body.append(f"{n} = {val.expr}" + _op(val))
                done.add(n)
        body += self._stores("vec") + self._stores("row")
        return self.signature("one_pass_kernel") + "\n" + _indent(body)

    def _chunked(self, lines) -> list[str]:
        """``lines(masked)`` over one row in BLOCK chunks of columns counted from the row's 16-aligned start.

        The row [lead, end) is read as a masked head chunk, full chunks without masks whose
        loads and stores start on 16-element boundaries (so Triton vectorizes them even when
        n_cols is odd, e.g. a 50257-word vocabulary), and a masked tail chunk.
        """
        # the chunk's first column: the four-per-call stream's group counter and a stored mask's start read it
        chunk = self.p.rand4 or any(self.v[o].kind == "vec" and self.v[o].is_bool for o in self.p.outputs)
        body = ["cols = tl.arange(0, BLOCK)[None, :]"] + (["chunk = 0"] if chunk else []) + [
                "mask = row_mask & (cols >= lead) & (cols < end)"] + lines(True)
        body += ["for start in range(BLOCK, n_main, BLOCK):",
                 "    cols = start + tl.arange(0, BLOCK)[None, :]"] + (["    chunk = start"] if chunk else []) \
            + ["    " + ln for ln in lines(False)]
        body += ["if tail < end:",
                 "    cols = tail + tl.arange(0, BLOCK)[None, :]"] + (["    chunk = tail"] if chunk else []) + [
                 "    mask = row_mask & (cols < end)"] + ["    " + ln for ln in lines(True)]
        return body

    def looped(self) -> str:
        body = self.prologue() + [
            "# one row per program (ROWS == 1); columns are counted from the row's 16-aligned start",
            "row_start = tl.program_id(0).to(tl.int64) * n_cols",
            "abase = (row_start // 16) * 16",
            "lead = (row_start - abase).to(tl.int32)",
            "end = lead + n_cols",
            "n_main = (end // BLOCK) * BLOCK",
            "tail = tl.maximum(n_main, BLOCK)",
        ]
        done: set[str] = set()
        for level in range(1, self.p.levels + 1):
            reds = [v for v in self.v.values() if v.kind == "row" and v.reduce and v.level == level]
            if not reds:
                continue
            body.append(f"# pass {level}: {', '.join(r.name for r in reds)}")
            inits, finals, roots = [], [], []
            # the online sum computed in the same pass as each max (None: a plain reduction)
            partners = {r.name: next((s for s in reds if s.online_max == r.name), None) for r in reds}
            for r in reds:
                acc = f"acc_{r.name}"
                if r.online_max:
                    continue  # accumulated together with its max below
                roots.append(r.operand)
                if r.center:
                    roots.append(r.center)
                partner = partners[r.name]
                if r.reduce == "max" and partner is not None:
                    inits += [f'{acc} = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)',
                              f"acc_{partner.name} = tl.zeros([ROWS, BLOCK], tl.float32)"]
                    finals += [self._finalize(r, acc),
                               f'{r.name}_safe = tl.where({r.name} == float("-inf"), 0.0, {r.name})',
                               f"{partner.name} = tl.sum(acc_{partner.name} * tl.exp({acc} - {r.name}_safe), axis=1)[:, None]"
                               + _op(partner)]
                    continue
                init = {"max": 'tl.full([ROWS, BLOCK], float("-inf"), tl.float32)',
                        "min": 'tl.full([ROWS, BLOCK], float("inf"), tl.float32)',
                        "any": "tl.zeros([ROWS, BLOCK], tl.int32)"}.get(r.reduce, "tl.zeros([ROWS, BLOCK], tl.float32)")
                inits.append(f"{acc} = {init}")
                finals.append(self._finalize(r, acc))

            def pass_lines(masked: bool, reds=reds, roots=roots, partners=partners) -> list[str]:
                lines = self._vec_lines(self._vec_closure(roots), aligned=True, masked=masked)
                for r in reds:
                    acc = f"acc_{r.name}"
                    if r.online_max:
                        continue
                    partner = partners[r.name]
                    if r.reduce == "max" and partner is not None:
                        sacc, x = f"acc_{partner.name}", r.operand
                        lines += [f'xm = tl.where(mask, {x}, float("-inf"))' if masked else f"xm = {x}",
                                  f'd = tl.exp(-tl.abs(tl.where(xm == float("-inf"), float("-inf"), xm - {acc})))',
                                  f"{sacc} = tl.where(xm > {acc}, {sacc} * d + 1.0, {sacc} + d)",
                                  f"{acc} = tl.maximum({acc}, xm)"]
                        continue
                    combine = {"max": "tl.maximum({a}, {x})", "min": "tl.minimum({a}, {x})",
                               "any": "tl.maximum({a}, {x})"}.get(r.reduce, "{a} + {x}")
                    lines.append(f"{acc} = " + combine.format(a=acc, x=self._masked(r, masked)))
                return lines

            if any(partners.values()):
                inits += ["# online sum of exp(x - max) per lane with ONE exp: the larger of x and the",
                          "# running max gets exp(0) = 1, the other exp(-|x - max|); -inf lanes add 0"]
            body += inits + self._chunked(pass_lines) + finals
            done.update(r.name for r in reds)
            body += self._row_pointwise_after(level, done)
        vec_outs = [o for o in self.p.outputs if self.v[o].kind == "vec"]
        if vec_outs:
            body.append("# last pass: recompute and store the full-row outputs")
            body += self._chunked(lambda masked: self._vec_lines(self._vec_closure(vec_outs), aligned=True, masked=masked)
                                  + self._stores("vec", aligned=True, masked=masked))
        body += self._stores("row")
        return self.signature("looped_kernel", aligned=True) + "\n" + _indent(body)


def _indent(lines: list[str]) -> str:
    return "\n".join("    " + ln for ln in lines) + "\n"


def reference_source(spec: PatternSpec, name: str = "pattern") -> str:
    """The pattern as a plain function of aten/prims ops (the eager reference and search function).

    Parameters
    ----------
    spec : PatternSpec
        The pattern.
    name : str
        The function's name.

    Returns
    -------
    str
        Python source of ``def name(x0, ..., c0, ...)`` returning the outputs as a tuple.
    """
    return source.render(spec.nodes, spec.n_inputs, spec.n_consts, spec.outputs, name)


def kernel_source(prog: Program) -> str:
    """The Triton part of kernel.py: ``one_pass_kernel`` and ``looped_kernel``.

    Parameters
    ----------
    prog : Program
        The lowered pattern (``miner.generate.lower.lower``).

    Returns
    -------
    str
        The two ``@triton.jit`` functions' source; they call helpers of ``miner.runtime.jit``
        (``jit_imports`` names the ones used).
    """
    em = _Emitter(prog)
    return em.one_pass() + "\n\n" + em.looped()


def jit_imports(code: str) -> str:
    """The import line of the ``miner.runtime.jit`` helpers that ``code`` calls ("" when none).

    Parameters
    ----------
    code : str
        Kernel source.

    Returns
    -------
    str
        ``"from miner.runtime.jit import a, b\n"``, names sorted, or "".
    """
    used = sorted(n for n in JIT_HELPERS if re.search(rf"(?<![\w.]){n}\(", code))
    return f"from miner.runtime.jit import {', '.join(used)}\n" if used else ""


def fill_template(template: str, /, **values) -> str:
    """A generated file's text: ``templates/<template>`` with its ``${key}`` fields filled in.

    Parameters
    ----------
    template : str
        The template's file name under ``miner/generate/templates/`` (``"kernel.py.tmpl"``).
    **values
        One value per field (``str()`` of it is inserted); a missing field raises ``KeyError``.

    Returns
    -------
    str
        The filled-in text (``string.Template.substitute``).
    """
    return Template((TEMPLATES / template).read_text()).substitute(**values)


def render_kernel_py(prog: Program, head: str) -> str:
    """A generated ``kernel.py``: header, docstring, ``reference``, both kernels and ``launch``.

    Parameters
    ----------
    prog : Program
        The lowered pattern.
    head : str
        The generated-file header (``miner.generate.generate.header``).

    Returns
    -------
    str
        The file's text (``templates/kernel.py.tmpl`` filled in).
    """
    spec = prog.spec
    params = signature_params(spec)
    kernels = kernel_source(prog)
    reference, random_consts, spec_args = reference_source(spec, name="reference"), "", ""
    if prog.random or prog.seed_inputs:
        # the reference draws the kernel's random numbers (``launch.triton_rand``; the four-per-call
        # stream: ``philox.rand``, plain torch), so a float64 reference run compares element for
        # element, masks included
        draw = "_philox.rand(" if prog.rand4 else "_launch.triton_rand("
        reference = reference.replace(f"{PRIM_RANDOM}(", draw)
        for name in elided_casts(prog):  # as Inductor computes them: in float32, see ``elided_casts``
            reference = reference.replace(f"    {name} = {PRIM_CONVERT}(", f"    {name} = _launch.elided_cast(")
        random_consts = (f"SEEDS = {prog.seed_inputs!r}  # inputs that are dropout seed vectors (one seed per program)\n"
                         f"COLUMNS = {spec.column_inputs!r}  # inputs read once per program when broadcast over the rows\n"
                         f"RANDOM = {prog.random!r}  # draws inductor_random's numbers in the kernel (reference: the same numbers)\n")
        spec_args = ", seeds=SEEDS, columns=COLUMNS"
        if prog.rand4:
            random_consts += ('RNG = "philox4"  # u(L) = word L % 4 of Philox4x32-10 at counter L // 4 '
                              "(miner.runtime.philox)\n")
            spec_args += ", rand4=True"
    elif spec.column_inputs:  # a region without random numbers reading a per-column vector (a norm's weight)
        random_consts = (f"COLUMNS = {spec.column_inputs!r}  # inputs read once per program when broadcast over "
                         f"the rows\n")
        spec_args = ", columns=COLUMNS"
    if prog.gathers:
        kernels += "\n\n" + gather_views_source(prog)
        spec_args += ", views=_gather_views"
    imports = jit_imports(kernels)
    if random_consts:
        imports += "import torch._inductor.inductor_prims  # noqa: F401 - registers prims.inductor_random & co.\n"
    if prog.rand4:
        imports += "from miner.runtime import philox as _philox\n"
    return fill_template(
        "kernel.py.tmpl", head=head, id=spec.id, params=", ".join(params), levels=prog.levels,
        output_kinds=repr(prog.output_kinds), jit_imports=imports, random_consts=random_consts,
        spec_args=spec_args, reference=reference, kernels=kernels,
        tensors="(" + ", ".join(f"x{k}" for k in range(spec.n_inputs)) + ",)",
        scalars="(" + "".join(f"int(c{c}), " if c in prog.seed_consts else f"float(c{c}), "
                              for c in range(spec.n_consts)) + ")")


def elided_casts(prog: Program) -> list[str]:
    """The values whose cast to bf16/fp16 the kernel (and its reference) leave out: a random number's,
    and any cast whose result is no output (``prims.convert_element_type`` of an intermediate, e.g.
    t5's position bias rounded to bf16 before it is added to float32 scores).

    Inductor computes such intermediates in float32: its Triton ``to_dtype`` emits ``.to(tl.float32)``
    for a bf16/fp16 target (``use_compute_types``) unless ``config.emulate_precision_casts`` is on (the
    ``randomness`` rule then declines the rewrite). The kernel replaces Inductor's, so it computes what
    Inductor computes, and its reference does the same; casts of outputs are kept (they are stored).
    """
    out = []
    for j, node in enumerate(prog.spec.nodes):
        name = f"v{j}"
        val = prog.values.get(name)
        if val is None or val.op != "prims.convert_element_type":
            continue
        dt = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
        low = isinstance(dt, dict) and dt.get("dtype") in ("bfloat16", "float16")
        if any(prog.values[d].random for d in val.deps) or low and name not in prog.outputs:
            out.append(name)
    return out


def gather_views_source(prog: Program) -> str:
    """``_gather_views(xs)`` of a kernel.py whose pattern holds embeddings (``Program.gathers``).

    For ``embedding(table, index)`` followed by views, the kernel reads element ``e`` of the viewed
    result as ``table[index_v[e], col_v[e]]``: ``index_v`` is the index with a stride-0 column dim
    appended, ``col_v`` the table's row 0 broadcast over the index's shape (its column stride kept),
    both put through the same views as the result, so that their strides in the rows' space give each
    element's index and column; the kernel adds ``index * x<table>_g`` (the table's row stride).

    Parameters
    ----------
    prog : Program
        A lowered pattern with ``gathers``.

    Returns
    -------
    str
        Python source of ``_gather_views(xs) -> (xs with each table and index replaced by its view, the
        tables' row strides)``, called by ``miner.runtime.launch.run`` before laying the rows out.
    """
    lines = ["def _gather_views(xs):",
             '    """The row inputs of the embeddings (table column and index, seen through the views',
             '    of the embedding result) and each table\'s row stride (``miner.generate.emit.gather_views_source``)."""',
             "    xs = list(xs)",
             "    strides = []"]
    if any(re.search(r"\bx\d+\.", source.arg_source(a)) for g in prog.gathers for n in g.views for a in n.args[1:]):
        lines.insert(4, "    " + ", ".join(f"x{k}" for k in range(prog.spec.n_inputs)) + ", = xs  # sizes tied to inputs")
    for g in prog.gathers:
        w, i = g.table, g.index
        lines += [f"    w, i = xs[{w}], xs[{i}]",
                  "    if w.dim() != 2 or w.shape[0] == 0:",
                  f'        raise _launch.ContractError(f"{prog.spec.id}: embedding table of shape {{list(w.shape)}} (2-D, rows > 0)")',
                  "    t = w[0].expand(*i.shape, w.shape[1])  # column c of the table at every index position",
                  "    j = i.unsqueeze(-1).expand(*i.shape, w.shape[1])  # the index, the same for every column"]
        for node in g.views:
            rest = ", ".join(source.arg_source(a) for a in node.args[1:])
            call = source.callable_source(node.target)
            lines.append(f"    t, j = {call}(t, {rest}), {call}(j, {rest})  # {node.target}")
        lines += [f"    xs[{w}], xs[{i}] = t, j", "    strides.append(w.stride(0))"]
    lines.append("    return xs, tuple(strides)")
    return "\n".join(lines) + "\n"


def gather_dims(prog: Program, inputs: list[dict]) -> list[dict]:
    """Where each embedding's index dims and table column land in the rows' space, for one observed entry.

    ``_gather_views`` is run on meta tensors of the entry's shapes, the index given distinct strides,
    so each viewed dim names its source. ``miner.check.cases`` reshapes a gathered input with this
    when it shrinks an entry for the interpreter (the table keeps its rows; its columns and the index
    dims follow the rows' dims they land on).

    Parameters
    ----------
    prog : Program
        A lowered pattern with ``gathers``.
    inputs : list of dict
        The entry's inputs (``{"shape", "dtype", ...}``).

    Returns
    -------
    list of dict
        Per gather ``{"table": k, "index": i, "index_dims": [...], "column_dim": d}``: dims counted
        from the right of the rows' shape (negative), one per index dim.
    """
    import torch

    from miner.core.source import compile_function
    from miner.runtime import launch

    fn = compile_function(gather_views_source(prog).replace("_launch.", "launch."), "_gather_views", "<gather>")
    fn.__globals__["launch"] = launch
    xs = [torch.empty(i["shape"], dtype=getattr(torch, i["dtype"]), device="meta") for i in inputs]
    out = []
    for g in prog.gathers:
        shape = list(inputs[g.index]["shape"])
        probe = [1 << (2 * d + 4) for d in range(len(shape))]  # distinct strides, none 0 or the column's 1
        ys = list(xs)
        ys[g.index] = torch.empty_strided(shape, probe, dtype=torch.int64, device="meta")
        ys[g.table] = torch.empty_strided(inputs[g.table]["shape"], (1 << 40, 1), device="meta")
        viewed, _ = fn(ys)
        t, j = viewed[g.table], viewed[g.index]
        index_dims = [next(e - j.dim() for e in range(j.dim()) if j.stride(e) == st and j.shape[e] == n)
                      for st, n in zip(probe, shape)]
        column = next(e - t.dim() for e in range(t.dim()) if t.stride(e) == 1 and t.shape[e] > 1)
        out.append({"table": g.table, "index": g.index, "index_dims": index_dims, "column_dim": column})
    return out


PRIM_RANDOM = "torch.ops.prims.inductor_random.default"
PRIM_CONVERT = "torch.ops.prims.convert_element_type.default"


__all__ = ["gather_dims", "gather_views_source", "kernel_source", "reference_source", "render_kernel_py", "fill_template", "jit_imports", "signature_params"]
