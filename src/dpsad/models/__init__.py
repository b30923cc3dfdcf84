"""Networks: the conditional UNet and the discriminator.  GroupNorm only, never BatchNorm."""
