"""Faster kernels for the primitives the layers of modules.py are built from, and the record of
which ones --kernels chose (fast)."""
