"""The report's step composition figure: where each profiled model's step goes (``miner profile``).

One horizontal stacked bar per (model, mode): GEMMs, attention, Triton time up to its memory floor,
Triton time above the floor (what a better fusion could win), other kernels (copies, other aten,
Triton without a byte count) and idle (step time no kernel covers). Reads ``profiles/`` only.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any, Sequence

#: (label, composition keys summed, colour), bottom to top of each bar.
SEGMENTS = (("gemm", ("gemm",), "#4c72b0"), ("attention", ("attention",), "#55a868"),
            ("Triton at floor", ("triton_floor",), "#8fb8de"), ("Triton above floor", ("triton_above_floor",), "#dd5555"),
            ("other", ("copy", "other_aten", "triton_no_bytes"), "#b0b0b0"), ("idle", ("idle",), "#eeeeee"))


def segments(profile: Any) -> list[tuple[str, float]]:
    """``[(segment label, ms per step)]`` of one ``StepProfile``, in :data:`SEGMENTS` order."""
    c = profile.composition()
    return [(label, sum(c.get(k, 0.0) for k in keys)) for label, keys, _ in SEGMENTS]


def composition_chart(profiles: Sequence[Any]) -> str | None:
    """The stacked bar chart as a PNG data URI (None without profiles)."""
    if not profiles:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{p.model} {p.mode}" for p in profiles]
    plt.rcParams.update({"font.size": 10})
    fig, ax = plt.subplots(figsize=(7.0, 0.45 * len(profiles) + 1.4))
    left = [0.0] * len(profiles)
    for i, (label, _, colour) in enumerate(SEGMENTS):
        widths = [segments(p)[i][1] for p in profiles]
        ax.barh(names, widths, left=left, color=colour, label=label, edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, widths)]
    for y, p in enumerate(profiles):
        ax.text(left[y] * 1.01, y, f"{p.step_ms:.1f} ms", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (CUDA events; kernels from torch.profiler)")
    ax.legend(fontsize=9, frameon=False, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.spines[["top", "right"]].set_visible(False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def composition_html(ws: Any) -> str:
    """The report section (figure + table), or "" when the workspace has no step profiles."""
    from miner.scan import profile as prof

    profiles = prof.load_all(ws)
    if not profiles:
        return ""
    uri = composition_chart(profiles)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["model", "mode", "step ms", *(s[0] for s in SEGMENTS),
                                                           "GPU"])
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in
                                    [p.model, p.mode, f"{p.step_ms:.2f}", *(f"{v:.2f}" for _, v in segments(p)),
                                     p.provenance.get("gpu", p.device)]) + "</tr>" for p in profiles)
    bw = ", ".join(sorted({f"{p.copy_bw / 1e12:.2f}" for p in profiles}))
    return ('<section id="composition"><h2>Where the step time goes</h2>'
            f'<img alt="step composition" src="{uri}">'
            f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'
            f'<p class="small">Triton floor: each kernel\'s bytes (Inductor\'s own count) at the copy bandwidth '
            f'measured in the same run ({bw} TB/s). Triton above floor is the time a fusion could recover at best.'
            '</p></section>')
