"""What is done to the model itself: DTensor helpers, meta-device init, activation checkpointing, compile,
device moves."""
