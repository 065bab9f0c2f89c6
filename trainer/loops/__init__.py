"""The loops: fit, evaluation and predict, automatic optimization, the loops' typed state, their schedule,
the model's train/eval mode and what predict keeps."""
