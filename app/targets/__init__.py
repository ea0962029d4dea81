"""Servers to benchmark against in tests and demos: the simulator, and launchers for llama.cpp
(xllamacpp) and ``transformers serve``."""
