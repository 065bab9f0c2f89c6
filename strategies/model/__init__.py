"""What the strategy does to the user's model and optimizer: DTensor helpers, meta-device init, activation
checkpointing, compile, device moves, tied parameters, and the optimizer wrapper `optimizers()` hands out."""
