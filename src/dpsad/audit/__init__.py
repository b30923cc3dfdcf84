"""Empirical privacy audit: canaries in one training run and a lower bound on epsilon (Steinke et al. 2023)."""
