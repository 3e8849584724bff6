"""The report's measured sections (3.x) and its appendices, one module per part of
findings.json: `cold_start`, `fp4`, `speculative`, `throughput`, `gap` (the gap stage's
section and the split of the tuned step, "where the rest goes") and `appendices`, with
`configurations` holding what the measured sections share.

Each module turns its own part into a StageSection; a part that is missing or null
becomes a section that says it was not run, nothing filled in. Plots come from
`reports.plots` and are numbered in order of appearance. `reports.content.build_report`
puts the sections in order, so a new pipeline's section is one new module here and one
line there.
"""
