"""dp-GAN baseline (Zhang et al. 2018): improved WGAN with a DP-SGD critic."""
