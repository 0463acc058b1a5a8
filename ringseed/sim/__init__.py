"""Discrete-event simulator of the distribution swarm, driving ringseed's own agent core and tracker.

Modules: :mod:`~ringseed.sim.scenario` (values and the bound T*), :mod:`~ringseed.sim.flow`
(full-duplex fluid links), :mod:`~ringseed.sim.swarm` (the real
:class:`~ringseed.protocol.agentcore.AgentCore` per node and the real
:class:`~ringseed.protocol.tracker.Tracker`, on simulated links, time and failures). Imports
only ringseed.protocol and the standard library.
"""
