"""MIG geometry (as data) and occupancy arithmetic on memory-slice masks."""

from shared.mig.geometry import Geometry, GpuModel, Profile, default_geometry, load_geometry

__all__ = ["Geometry", "GpuModel", "Profile", "default_geometry", "load_geometry"]
