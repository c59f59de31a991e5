"""The network side of a training node: its RDMA NICs (InfiniBand, or RoCE on Ethernet), read from sysfs.

Between nodes, a collective's bandwidth is the NICs'. Without them a communication-heavy rank cannot be told
apart from one waiting on a slow peer; with them, "network-bound" needs a busy (or erroring) network.
"""
