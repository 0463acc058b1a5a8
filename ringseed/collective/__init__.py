"""Collectives between training peers: a ring data plane, its control, and a torch.distributed backend.

Modules (import the one you need; nothing heavy is imported here, and torch never is):
- ``engine``: :class:`engine.RingEngine`, one peer's data plane (all-reduce, broadcast,
  all-gather, reduce-scatter over TCP ring links), ``CollectiveAborted``, ``PeerAddress``.
- ``ops`` (reduce operators, dtypes, bfloat16), ``quantize`` (int8/fp16/bf16 transfer encodings),
  ``schedule`` (ring segment schedules, pure), ``runner`` (runs a schedule on sockets),
  ``transport`` (listener, dialer, handshake and frames on sockets).
- ``tensors`` (torch tensors <-> engine buffers, CUDA staging) and ``torch_backend`` (importing it
  registers the ``ringseed`` backend of ``torch.distributed``): the only modules that import torch.
- ``communicator``, ``control``, ``state``, ``retry``: fault-tolerant groups on a coordinator.
"""
