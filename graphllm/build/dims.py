"""The symbolic dims the builder uses, each bound by a Workload."""

from __future__ import annotations

from graphllm.ir import Dim

# the symbolic dims a Workload binds
B = Dim("B", "batch")
T = Dim("T", "token")
P = Dim("P", "key_token")
S = Dim("S", "key_token")
C = Dim("C", "slot")
T_LAST = Dim("T_last", "token", 1)  # the last new position alone (logits for a server)
# a sliding-window layer's cache keeps only the last W-1 past positions (as transformers' does)
P_W = Dim("P_w", "key_token")
S_W = Dim("S_w", "key_token")
