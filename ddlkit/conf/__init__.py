"""Hydra primary config (a package so Hydra can find it when ddlkit is installed)."""
