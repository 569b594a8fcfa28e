"""The traced frontend: any causal LM that the installed transformers implements, read from its
own modeling code on fake tensors into a graphllm Graph (the built families' twin).

    graph = traced_graph(config_json_dict, Workload(seq_len=128))

torch and transformers are needed here alone (graphllm.trace.hf says what to install).
"""

from graphllm.trace.model import TracedConfig, traced_graph

__all__ = ["TracedConfig", "traced_graph"]
