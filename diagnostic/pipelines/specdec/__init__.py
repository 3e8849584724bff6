"""Speculative-decoding tuning (the `specdec` stage): the setting that is actually fastest,
per workload and for the customer's mix, found in bounded lab time.

`run_specdec(session, config, log=..., progress=..., check_cancelled=...)` is the entry
point (`pipeline.py`); `search.py` is the k-search, `decide.py` the statistics of the
decision, `catalog.py` the lab's draft catalog (`drafts.yaml`).
"""

from diagnostic.pipelines.specdec.pipeline import run_specdec

__all__ = ["run_specdec"]
