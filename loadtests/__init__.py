"""Locust load tests, heavy in client disconnects, for any OpenAI-compatible server.

`python -m loadtests run --help` runs one: it drives Locust headless, samples the server's
`/metrics` during the run, then fails if anything leaked (requests still running or waiting,
KV-cache usage above its idle value) or if the server decoded more than a few engine steps per
disconnect for clients that had left (`WASTE:`, exit 4), and writes reports and a plot.
`python -m loadtests probe --host URL` measures the engine steps a disconnect costs, alone.
"""
