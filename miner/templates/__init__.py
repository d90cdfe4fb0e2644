"""The HTML report's page skeleton and style (inline, so the page is one self-contained file)."""

CSS = """
:root { --ink:#1d2330; --mute:#5d6778; --line:#dde2ea; --bg:#f6f7f9; --card:#fff; --accent:#2a62c9;
        --good:#1f8a4c; --bad:#c0392b; --warn:#a86400; --pred:#7a4bb5; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color:var(--ink);
       background:var(--bg); }
header { background:#17233b; color:#fff; padding:22px 36px 18px; }
header h1 { margin:0 0 4px; font-size:22px; font-weight:600; }
header .sub { color:#b8c4da; font-size:13px; }
main { max-width:1280px; margin:0 auto; padding:18px 36px 60px; }
nav.toc { font-size:13px; margin:6px 0 14px; color:var(--mute); }
nav.toc a { margin-right:14px; }
section { overflow-x:auto; background:var(--card); border:1px solid var(--line); border-radius:8px; padding:16px 22px;
          margin:16px 0; }
h2 { font-size:17px; margin:0 0 10px; }
h3 { font-size:15px; margin:18px 0 6px; }
h4 { font-size:13px; margin:14px 0 4px; color:var(--mute); text-transform:uppercase; letter-spacing:.04em; }
a { color:var(--accent); text-decoration:none; } a:hover { text-decoration:underline; }
table { border-collapse:collapse; width:100%; font-size:13px; }
th, td { padding:5px 8px; border-bottom:1px solid var(--line); text-align:left; vertical-align:top; }
th { background:#eef1f6; font-weight:600; white-space:nowrap; position:sticky; top:0; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
tr.family:hover { background:#f3f6fb; }
td.ops { font-family:"DejaVu Sans Mono", Menlo, monospace; font-size:12px; min-width:220px; }
code, .mono { font-family:"DejaVu Sans Mono", Menlo, monospace; font-size:12px; }
.pred { color:var(--pred); font-style:italic; }
.meas { color:var(--ink); font-weight:600; }
.good { color:var(--good); } .bad { color:var(--bad); } .warn { color:var(--warn); }
.banner { border-left:4px solid var(--warn); background:#fff8ec; padding:10px 14px; margin:10px 0; border-radius:4px; }
.banner.info { border-color:var(--accent); background:#eef4ff; }
.legend { font-size:12.5px; color:var(--mute); margin:6px 0 0; }
.badge { display:inline-block; padding:1px 7px; border-radius:10px; font-size:11.5px; font-weight:600;
         background:#e8ebf1; color:#3b4456; white-space:nowrap; }
.badge.promoted { background:#d9f2e3; color:#176a3a; } .badge.benchmarked { background:#dde9ff; color:#1f4ea3; }
.badge.validated { background:#e6f0ff; color:#2a62c9; } .badge.failed { background:#fbe1de; color:#a5281b; }
.badge.mined { background:#f1f1f1; color:#777; }
details.members > summary { cursor:pointer; color:var(--accent); font-size:12.5px; }
details.members table { margin:6px 0 4px 18px; width:calc(100% - 18px); background:#fafbfd; }
tr.members > td { border-bottom:1px solid var(--line); padding-top:0; }
.cand { display:grid; grid-template-columns: fit-content(420px) 1fr; gap:18px; align-items:start; }
.cand img { max-width:100%; max-height:640px; border:1px solid var(--line); border-radius:6px; background:#fff; }
.facts td:first-child { color:var(--mute); width:38%; }
.chart img { max-width:100%; }
.small { font-size:12px; color:var(--mute); }
.scroll { max-height:320px; overflow:auto; border:1px solid var(--line); border-radius:4px; }
footer { color:var(--mute); font-size:12px; text-align:center; margin:30px 0; }
"""
