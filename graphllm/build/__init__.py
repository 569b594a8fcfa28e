"""ModelConfig + Workload -> Graph: the decoder as op nodes, and the values of its weights."""

from graphllm import ops  # noqa: F401  (registers the op rows every built node is checked against)
