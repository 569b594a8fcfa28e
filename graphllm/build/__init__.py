"""ModelConfig + Workload -> Graph: the decoder as op nodes, and the values of its weights."""
