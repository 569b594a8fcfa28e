"""Running graphs: the numpy interpreter, onnxruntime sessions and bench, SPMD in one process."""
