"""Placement policies, one module each; every module here registers itself with ``shared.policy.placement.registry``."""
