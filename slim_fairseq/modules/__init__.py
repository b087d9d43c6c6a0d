"""Technique modules, one file each (docs/DESIGN.md)."""
