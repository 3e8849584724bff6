"""Written findings: a job's findings.json turned into the PDF report, its money-back
status, and the email that delivers it.

Entry points: `reports.render.render` (findings -> report.pdf) and
`reports.email` (the report-ready message, sent once per report version).
"""
