"""The symbolic dims the builder uses, each bound by a Workload.

Absolute token positions run over the past 0..P-1, then the T new tokens P..P+T-1; each position
axis declares which of them it indexes (`Dim.positions`), so passes never need these names.
"""

from __future__ import annotations

from graphllm.ir import Dim

NEW = ("P", "P+T")  # the new tokens of this step
B = Dim("B", "batch")
T = Dim("T", "token", positions=NEW)
P = Dim("P", "key_token", positions=("0", "P"))
S = Dim("S", "key_token", positions=("0", "P+T"))
C = Dim("C", "slot", positions=NEW)  # each slot holds one of the new tokens
# the last new position alone (logits for a server)
T_LAST = Dim("T_last", "token", 1, positions=("P+T-1", "P+T"))
# a sliding-window layer's cache keeps only the last W-1 past positions (as transformers' does)
P_W = Dim("P_w", "key_token", positions=("P-P_w", "P"))
S_W = Dim("S_w", "key_token", positions=("P-P_w", "P+T"))
# a chunked layer's cache keeps the last C-1 past positions (transformers holds it in a
# sliding-window layer of the chunk size), apart from the windows' when a model has both
P_C = Dim("P_c", "key_token", positions=("P-P_c", "P"))
S_C = Dim("S_c", "key_token", positions=("P-P_c", "P+T"))
