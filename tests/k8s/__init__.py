"""Tests against an emulated Kubernetes API (no cluster runs here)."""
