"""compute=ray: a ddlkit job as a Ray job, its ranks placed as a gang on a Ray cluster.

Kept empty: every rank imports this package through ``python -m ddlkit_ray.rank`` before its
worker starts, so it must cost nothing.
"""
