"""Old import locations kept for compatibility (vLLM keeps ``vllm.engine`` the same way)."""
