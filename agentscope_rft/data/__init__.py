"""The data side: task selection, experience operators and LLM judges (see docs/data.md)."""
