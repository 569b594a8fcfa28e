"""Run a partitioned program for real: one process per rank, collectives on torch.distributed.

segments.py cuts a rank's program at its collective and send/recv nodes; comm.py carries those
nodes out on torch.distributed; rank.py is one rank's greedy generation (prefill, cached decode);
launch.py starts N ranks on this machine and watches them; worker.py is the entry `torchrun`
runs. torch is the `dist` extra: imported inside functions only, when a run needs it.
"""
