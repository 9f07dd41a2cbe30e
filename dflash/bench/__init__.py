"""The benchmark: `python -m dflash bench` (cli), the runs (runner), transformers baselines (baselines), machine
and memory facts (machine), summaries and the Markdown table (report), forward-cost measurements (profile)."""
