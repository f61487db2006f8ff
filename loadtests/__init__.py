"""Locust load tests, heavy in client disconnects, for any OpenAI-compatible server.

`python -m loadtests run --help` runs one: it drives Locust headless, samples the server's
`/metrics` during the run, then fails if anything leaked (requests still running or waiting,
KV-cache usage above its idle value) and writes reports and a plot.
"""
