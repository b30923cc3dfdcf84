"""Training loops: the diffusion teacher (and non-private model) and the DP-SAD student."""
