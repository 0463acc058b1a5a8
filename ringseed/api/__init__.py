"""ringseed's Kubernetes API: constants, spec types, validation and condition names. No I/O.

Import the modules: ``from ringseed.api import constants, validation``.
"""
