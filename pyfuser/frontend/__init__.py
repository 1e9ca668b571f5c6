"""The Python frontend: FusionDefinition and its ``fd.ops``."""

from pyfuser.frontend.fusion_definition import FusionDefinition

__all__ = ["FusionDefinition"]
