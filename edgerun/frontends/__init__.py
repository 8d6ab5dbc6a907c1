"""Frontends: turn a model from another framework (PyTorch, ONNX) into an edgerun IR graph."""
