"""Check that every Triton kernel of >= 200 us/step in the four profiles joins a region pattern.

A profile kernel lists its call sites (``name:handle``, from the capture's kernel map) and the
graph it ran in; ``mined/regions.json`` lists, per region pattern, its occurrences with the call
site (``kernel.name``) and graph. A kernel is mapped when each of its call sites is an occurrence
of some region pattern. Run from this folder: ``python check_mapped.py [threshold_us]``.
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("bert", "gpt2", "llama", "t5")


def graph_id(g):
    """``{model, preset, mode, phase, index}`` -> ``model/preset/mode-phase-index`` (the profiles' form)."""
    return f"{g['model']}/{g['preset']}/{g['mode']}-{g['phase']}-{g['index']}"


def main(threshold_us=200.0):
    regions = json.loads((HERE / "mined" / "regions.json").read_text())["region_patterns"]
    site_to_region = {}
    for r in regions:
        for o in r["occurrences"]:
            site_to_region[(graph_id(o["occurrence"]["graph"]), o["kernel"]["name"])] = r["id"]
    n_big = n_unmapped = n_partial = 0
    us_big = 0.0
    for m in MODELS:
        prof = json.loads((HERE / "profiles" / f"{m}.train.profile.json").read_text())["profile"]
        for k in prof["kernels"]:
            if not k["kind"].startswith("triton") or k["us_per_step"] < threshold_us:
                continue
            n_big += 1
            us_big += k["us_per_step"]
            ids = [site_to_region.get((k["graph"], s)) for s in k["sites"]]
            hit = [i for i in ids if i]
            if not k["sites"] or not hit:
                n_unmapped += 1
                print(f"UNMAPPED {m} {k['name']} {k['us_per_step']:.0f} us/step sites={len(k['sites'])}")
            elif len(hit) < len(ids):
                n_partial += 1
                print(f"PARTIAL  {m} {k['name']} {len(hit)}/{len(ids)} sites in a region")
            else:
                print(f"mapped   {m:5} {k['us_per_step']:7.0f} us/step  {len(ids):3} sites -> "
                      f"{','.join(sorted(set(hit)))}  {k['name'][:70]}")
    print(f"Triton kernels >= {threshold_us:.0f} us/step: {n_big} ({us_big / 1000:.2f} ms/step); "
          f"unmapped: {n_unmapped}; partially mapped: {n_partial}; "
          f"region patterns: {len(regions)}, occurrences: {len(site_to_region)}")
    return 1 if n_unmapped or n_partial else 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 200.0))
