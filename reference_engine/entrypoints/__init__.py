"""Entry points: the OpenAI-compatible HTTP server and the ``reference-engine`` command."""
