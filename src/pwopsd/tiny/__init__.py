"""Tiny mode: a small Qwen3-architecture model that the workflow builds and pretrains itself on
synthetic multi-step integer arithmetic, so the whole DAG runs on a laptop CPU."""
