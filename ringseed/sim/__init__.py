"""Discrete-event simulator of the distribution swarm, driving ringseed.protocol's choice code.

Modules: :mod:`~ringseed.sim.scenario` (values and the bound T*), :mod:`~ringseed.sim.flow`
(full-duplex fluid links), :mod:`~ringseed.sim.state` (holdings), :mod:`~ringseed.sim.swarm`
(agents, origin duty, failures). Imports only ringseed.protocol and the standard library.
"""
