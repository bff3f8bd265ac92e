"""A minimal ``torchnet`` for the SMP e2e tests (SageMaker's MNIST example splits its data with
``torchnet.dataset.SplitDataset``); torchnet itself is not installed here."""
