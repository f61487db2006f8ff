"""An OpenAI-compatible HTTP server over ``AsyncLLM``, shaped like ``vllm serve``."""
