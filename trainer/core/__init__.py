"""The user's side of a run: TrainModule and its hook mixins, DataModule, hyperparameters, the
`configure_optimizers` forms and the `self.log` options."""
